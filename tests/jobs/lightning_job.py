"""A Lightning fit with the hpinteract callback (tests/integrations): a small MLP on
scikit-learn's digits, a per-step LambdaLR warmup, 2 ranks on gloo under torchrun (or
one process). Options come from the environment so that tests can vary them.

LJ_EPOCHS, LJ_BATCH (per rank), LJ_ACCUM, LJ_CLIP, LJ_CKPT (resume from), LJ_PKG
("lightning" or "pytorch_lightning"), LJ_DEVICES (Lightning's own launcher: no torchrun).
"""

import importlib
import json
import os
import sys

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

pkg = os.environ.get("LJ_PKG", "lightning")
L = importlib.import_module("lightning.pytorch" if pkg == "lightning" else "pytorch_lightning")

from hpinteract import HParam  # noqa: E402
from hpinteract.integrations.lightning import HPInteractCallback  # noqa: E402


class Digits(L.LightningModule):
    def __init__(self, cb: HPInteractCallback) -> None:
        super().__init__()
        self.cb = cb
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        # the user's own hyper-parameter, read as in a raw loop
        x = torch.nn.functional.dropout(x, p=self.cb.hp["dropout"], training=True)
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"])  # clashes: renamed
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        out = self.net(x)
        self.log("val_loss", torch.nn.functional.cross_entropy(out, y), sync_dist=True)
        self.log("val_acc", (out.argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        opt = torch.optim.AdamW([
            {"params": self.net[0].parameters()},
            {"params": self.net[2].parameters(), "lr": 0.02}], lr=0.01, weight_decay=0.01)
        warm = int(os.environ.get("LJ_WARMUP", "20"))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main() -> None:
    torch.manual_seed(0)
    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target)
    train = TensorDataset(x[:1500], y[:1500])
    val = TensorDataset(x[1500:], y[1500:])
    batch = int(os.environ.get("LJ_BATCH", "16"))
    cb = HPInteractCallback(specs={"dropout": HParam(0.0, low=0.0, high=0.9)})
    devices = int(os.environ.get("LJ_DEVICES") or os.environ.get("LOCAL_WORLD_SIZE", "1"))
    clip = float(os.environ.get("LJ_CLIP", "0")) or None
    trainer = L.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
        max_epochs=int(os.environ.get("LJ_EPOCHS", "3")), callbacks=[cb],
        accumulate_grad_batches=int(os.environ.get("LJ_ACCUM", "1")),
        gradient_clip_val=clip, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=os.environ.get("LJ_ROOT", os.getcwd()),
        num_sanity_val_steps=0, log_every_n_steps=1)
    model = Digits(cb)
    trainer.fit(model, DataLoader(train, batch_size=batch, shuffle=True),
                DataLoader(val, batch_size=64), ckpt_path=os.environ.get("LJ_CKPT") or None)
    # The script's own code after fit() runs on every rank, stopped or not.
    out = os.environ.get("LJ_OUT")
    if out and trainer.global_rank == 0:
        with open(out, "w") as f:
            json.dump({"global_step": trainer.global_step, "epoch": trainer.current_epoch,
                       "accumulate": trainer.accumulate_grad_batches,
                       "clip": trainer.gradient_clip_val,
                       "lrs": [g["lr"] for g in trainer.optimizers[0].param_groups],
                       "betas": [g["betas"] for g in trainer.optimizers[0].param_groups],
                       "wd": [g["weight_decay"] for g in trainer.optimizers[0].param_groups],
                       "dropout": cb.hp["dropout"]}, f)
    print("after fit", trainer.global_rank, file=sys.stderr)


if __name__ == "__main__":
    main()
