"""A PyTorch Lightning fit, tunable live by hpinteract: one callback is the whole change.

An MLP on scikit-learn's bundled digits (nothing downloaded), AdamW with two param groups
and a per-step LambdaLR warmup. Run it as you would any Lightning script:

    hpi.launch("examples/lightning/train.py", nproc=2)           # from a notebook
    hpinteract run examples/lightning/train.py --nproc 2
    torchrun --standalone --nproc-per-node 2 examples/lightning/train.py
    python examples/lightning/train.py --devices 2               # Lightning's own launcher

then ``hpi.attach("latest")`` from a notebook. The module reads its own hyper-parameter
(``dropout``) from the callback, as a raw loop reads ``run.hp``.
"""

import argparse
import importlib
import json
import os

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

import hpinteract as hpi
from hpinteract.integrations.lightning import HPInteractCallback

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=20)
parser.add_argument("--batch", type=int, default=16, help="samples per rank and forward")
parser.add_argument("--accumulate", type=int, default=1)
parser.add_argument("--clip", type=float, default=0.0, help="gradient_clip_val (0: off)")
parser.add_argument("--warmup", type=int, default=20, help="steps of the lr warmup")
parser.add_argument("--devices", type=int, default=0,
                    help="Lightning's own launcher (default: the ranks torchrun started)")
parser.add_argument("--ckpt", default=None, help="resume from this Lightning checkpoint")
parser.add_argument("--root", default=os.getcwd(), help="Trainer.default_root_dir")
parser.add_argument("--package", default="lightning", choices=("lightning", "pytorch_lightning"))
parser.add_argument("--report", default=None, help="write what the fit ended with (JSON)")
parser.add_argument("--csv-log", default=None, help="Lightning's CSVLogger in this folder")
args = parser.parse_args()
L = importlib.import_module("lightning.pytorch" if args.package == "lightning"
                            else "pytorch_lightning")

hpc = HPInteractCallback(specs={"dropout": hpi.HParam(0.0, low=0.0, high=0.9,
                                                      doc="dropout on the inputs")})


class Digits(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        x = torch.nn.functional.dropout(x, p=hpc.hp["dropout"], training=True)
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        # A name hpinteract records itself: it streams as "pl_lr".
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"])
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
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: min(1.0, (step + 1) / args.warmup))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main() -> None:
    torch.manual_seed(0)
    d = load_digits()  # 1,797 8x8 images, shipped with scikit-learn
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target)
    devices = args.devices or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    trainer = L.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
        max_epochs=args.epochs, callbacks=[hpc], accumulate_grad_batches=args.accumulate,
        gradient_clip_val=args.clip or None, enable_checkpointing=False,
        logger=L.loggers.CSVLogger(args.csv_log, name="fit") if args.csv_log else False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=args.root,
        num_sanity_val_steps=0, log_every_n_steps=1)
    trainer.fit(Digits(), DataLoader(TensorDataset(x[:1500], y[:1500]), batch_size=args.batch,
                                     shuffle=True),
                DataLoader(TensorDataset(x[1500:], y[1500:]), batch_size=64),
                ckpt_path=args.ckpt)
    # The script's own code after fit() runs on every rank, stopped or not.
    if args.report and trainer.global_rank == 0:
        groups = trainer.optimizers[0].param_groups
        with open(args.report, "w") as f:
            json.dump({"global_step": trainer.global_step, "epoch": trainer.current_epoch,
                       "accumulate": trainer.accumulate_grad_batches,
                       "clip": trainer.gradient_clip_val, "lrs": [g["lr"] for g in groups],
                       "betas": [g["betas"] for g in groups],
                       "wd": [g["weight_decay"] for g in groups],
                       "dropout": hpc.hp["dropout"]}, f)
    print("after fit", trainer.global_rank, flush=True)


if __name__ == "__main__":
    main()
