"""A Hugging Face Trainer run, tunable live by hpinteract: one callback is the whole change.

A GPT-2 of two layers built from a config (no download) learns generated token sequences
(each token follows from the last by a rule, with 10 % noise). Run it as you would any
Trainer script:

    hpi.launch("examples/transformers/train.py", nproc=2)        # from a notebook
    hpinteract run examples/transformers/train.py --nproc 2
    torchrun --standalone --nproc-per-node 2 examples/transformers/train.py
    accelerate launch --multi_gpu --num_processes 2 examples/transformers/train.py
    python examples/transformers/train.py                        # one process

then ``hpi.attach("latest")`` from a notebook.
"""

import argparse
import json
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from hpinteract.integrations.transformers import HPInteractCallback

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=2000)
parser.add_argument("--schedule", default="linear", help="lr_scheduler_type")
parser.add_argument("--warmup", type=int, default=20)
parser.add_argument("--batch", type=int, default=8, help="per_device_train_batch_size")
parser.add_argument("--clip", type=float, default=1.0, help="max_grad_norm")
parser.add_argument("--eval-every", type=int, default=50)
parser.add_argument("--output-dir", default="hf-out")
parser.add_argument("--resume", default=None, help="a checkpoint-<step> folder")
parser.add_argument("--report", default=None, help="write what train() ended with (JSON)")
parser.add_argument("--report-to", nargs="*", default=[],
                    help="the Trainer's trackers (tensorboard, wandb, mlflow)")
args = parser.parse_args()


class Tokens(torch.utils.data.Dataset):
    """Sequences that follow a rule (next = (prev * 3 + 1) mod 64), 10 % of tokens noise."""

    def __init__(self, n: int, length: int = 32, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        seq = [torch.randint(0, 64, (n, 1), generator=g)]
        for _ in range(length - 1):
            nxt = (seq[-1] * 3 + 1) % 64
            noise = torch.randint(0, 64, nxt.shape, generator=g)
            seq.append(torch.where(torch.rand(nxt.shape, generator=g) < 0.9, nxt, noise))
        self.ids = torch.cat(seq, 1)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=64, n_layer=2,
                                       n_head=2, bos_token_id=0, eos_token_id=0))
    training = TrainingArguments(
        output_dir=args.output_dir, use_cpu=True,
        # gloo between CPU ranks; one process needs no process group at all
        ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None,
        report_to=args.report_to, max_steps=args.steps, learning_rate=1e-3,
        lr_scheduler_type=args.schedule, warmup_steps=args.warmup,
        per_device_train_batch_size=args.batch, max_grad_norm=args.clip, logging_steps=1,
        save_strategy="no", eval_strategy="steps", eval_steps=args.eval_every,
        per_device_eval_batch_size=32, disable_tqdm=True, dataloader_num_workers=0, seed=0)
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(2048),
                      eval_dataset=Tokens(128, seed=1), callbacks=[HPInteractCallback()])
    trainer.train(resume_from_checkpoint=args.resume)
    # The script's own code after train() runs on every rank, stopped or not.
    if args.report and trainer.is_world_process_zero():
        with open(args.report, "w") as f:
            json.dump({"global_step": trainer.state.global_step,
                       "max_grad_norm": trainer.args.max_grad_norm,
                       "lrs": [g["lr"] for g in trainer.optimizer.param_groups]}, f)
    print("after train", flush=True)


if __name__ == "__main__":
    main()
