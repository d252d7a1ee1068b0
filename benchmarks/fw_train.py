"""The job of benchmarks/frameworks.py: a Lightning fit or a Hugging Face Trainer run,
with the hpinteract callback or without it; everything else is the same code.

Runs in: every rank (under torchrun or hpi.launch). Rank 0 times the steady state, from
the end of optimizer step ``--warmup`` to the end of step ``--warmup + --steps``, with a
plain timing callback that both variants have, and writes steps/s to ``--out``.

- lightning: an MLP 64 -> 512 -> 512 -> 10 on scikit-learn's digits, 32 per rank, SGD with
  momentum and a per-step LambdaLR, ``self.log("train_loss", ...)`` at every step;
- transformers: a GPT-2 of 2 layers and 64 dimensions built from a config (no download) on
  generated token sequences, 8 per rank, AdamW with the linear schedule, logging every 10.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import torch


class Clock:
    """The steady state's timing, by optimizer step (framework-neutral): rank 0's wall
    time, and every rank's CPU time over the same steps (all its threads: hpinteract's
    coordinator and sockets included), each rank writing ``<out>.cpu<rank>``."""

    def __init__(self, warmup: int, steps: int, out: str) -> None:
        self.warmup, self.steps, self.out = warmup, steps, out
        self.t0 = self.cpu0 = 0.0

    def at(self, step: int, rank: int) -> None:
        if step == self.warmup:
            self.t0, self.cpu0 = time.perf_counter(), time.process_time()
        elif step == self.warmup + self.steps:
            dt = time.perf_counter() - self.t0
            cpu = time.process_time() - self.cpu0
            with open(f"{self.out}.cpu{rank}", "w") as f:
                json.dump({"cpu_ms_per_step": 1e3 * cpu / self.steps}, f)
            if rank == 0:  # last: the driver reads the ranks' files once this one exists
                with open(self.out, "w") as f:
                    json.dump({"steps_per_s": self.steps / dt,
                               "ms_per_step": 1e3 * dt / self.steps}, f)


def lightning(a: argparse.Namespace, clock: Clock) -> None:
    import lightning.pytorch as L
    from sklearn.datasets import load_digits
    from torch.utils.data import DataLoader, TensorDataset

    class Timing(L.Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            clock.at(trainer.global_step, trainer.global_rank)

    class MLP(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                torch.nn.ReLU(), torch.nn.Linear(512, 10))

        def training_step(self, batch: Any, idx: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    d = load_digits()
    data = TensorDataset(torch.tensor(d.data, dtype=torch.float32) / 16.0,
                         torch.tensor(d.target))
    callbacks: list[Any] = [Timing()]
    if a.hpi:
        from hpinteract.integrations.lightning import HPInteractCallback

        callbacks.append(HPInteractCallback())
    world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    trainer = L.Trainer(
        accelerator="cpu", devices=world, strategy="ddp" if world > 1 else "auto",
        max_steps=a.warmup + a.steps + 1, callbacks=callbacks, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, log_every_n_steps=50)
    torch.manual_seed(0)
    trainer.fit(MLP(), DataLoader(data, batch_size=32, shuffle=True, drop_last=True))


def transformers(a: argparse.Namespace, clock: Clock) -> None:
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    class Timing(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.at(state.global_step, args.process_index)

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, n: int) -> None:
            self.ids = torch.randint(0, 64, (n, 32), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=64, n_layer=2,
                                       n_head=2))
    args = TrainingArguments(
        output_dir=a.tmp, use_cpu=True,
        ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None, report_to=[],
        max_steps=a.warmup + a.steps + 1, per_device_train_batch_size=8, logging_steps=10,
        save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0)
    callbacks: list[Any] = [Timing()]
    if a.hpi:
        from hpinteract.integrations.transformers import HPInteractCallback

        callbacks.append(HPInteractCallback())
    Trainer(model=model, args=args, train_dataset=Tokens(100_000), callbacks=callbacks).train()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--framework", choices=("lightning", "transformers"), required=True)
    ap.add_argument("--hpi", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tmp", default="/tmp/hpi-fw-bench")
    a = ap.parse_args()
    clock = Clock(a.warmup, a.steps, a.out)
    (lightning if a.framework == "lightning" else transformers)(a, clock)


if __name__ == "__main__":
    main()
