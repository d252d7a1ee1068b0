"""A Hugging Face Trainer run with the hpinteract callback (tests/integrations): a tiny
GPT-2 built from a config (no download) on locally generated token sequences, 2 ranks on
gloo under torchrun (or one process).

Options from the environment: HF_STEPS, HF_SCHED (lr_scheduler_type), HF_WARMUP, HF_BATCH
(per device), HF_ACCUM, HF_CLIP (max_grad_norm), HF_OUTDIR, HF_RESUME (a checkpoint folder),
HF_OUT (a JSON file the script writes after train()).
"""

import json
import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from hpinteract import HParam
from hpinteract.integrations.transformers import HPInteractCallback


class Tokens(torch.utils.data.Dataset):
    """Sequences that follow a rule (next = (prev * 3 + 1) mod 64, with noise): learnable."""

    def __init__(self, n: int, length: int = 32) -> None:
        g = torch.Generator().manual_seed(0)
        start = torch.randint(0, 64, (n, 1), generator=g)
        seq = [start]
        for _ in range(length - 1):
            nxt = (seq[-1] * 3 + 1) % 64
            noise = torch.randint(0, 64, nxt.shape, generator=g)
            keep = torch.rand(nxt.shape, generator=g) < 0.9
            seq.append(torch.where(keep, nxt, noise))
        self.ids = torch.cat(seq, 1)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=64, n_layer=2,
                                       n_head=2))
    env = os.environ.get
    args = TrainingArguments(
        output_dir=env("HF_OUTDIR", "hf-out"), use_cpu=True,
        ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None,  # one process: none
        report_to=[], max_steps=int(env("HF_STEPS", "200")), learning_rate=1e-3,
        lr_scheduler_type=env("HF_SCHED", "linear"), warmup_steps=int(env("HF_WARMUP", "20")),
        per_device_train_batch_size=int(env("HF_BATCH", "8")),
        gradient_accumulation_steps=int(env("HF_ACCUM", "1")),
        max_grad_norm=float(env("HF_CLIP", "1.0")), logging_steps=1, save_strategy="no",
        eval_strategy="steps", eval_steps=int(env("HF_EVAL", "50")),
        per_device_eval_batch_size=32, disable_tqdm=True, dataloader_num_workers=0,
        seed=0)
    cb = HPInteractCallback(specs={"label_note": HParam("none")})
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(2048),
                      eval_dataset=Tokens(128), callbacks=[cb])
    trainer.train(resume_from_checkpoint=env("HF_RESUME") or None)
    out = env("HF_OUT")
    if out and trainer.is_world_process_zero():
        with open(out, "w") as f:
            json.dump({"global_step": trainer.state.global_step,
                       "max_grad_norm": trainer.args.max_grad_norm,
                       "lrs": [g["lr"] for g in trainer.optimizer.param_groups]}, f)
    print("after train", file=sys.stderr)


if __name__ == "__main__":
    main()
