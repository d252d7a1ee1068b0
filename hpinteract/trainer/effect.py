"""The one place where hyper-parameters take effect on the optimizer and scheduler.

Runs in: every rank's training thread, at a step boundary (never inside a step).
Following nanoGPT's rule of one obvious place: lr, momentum and weight_decay become param
group values here; the loader reads batch_size itself when it starts its next batch.

What a set lr means under a running scheduler: the value set is the lr of the very next
optimizer step, and the schedule goes on from it with its shape kept. A scheduler that
multiplies a base lr by a factor of the step (LambdaLR: the warmup, linear and cosine
schedules of Hugging Face and most Lightning modules, which rewrite lr at every step) gets
``base_lrs = lr / factor(now)``: every later lr is what the schedule would have given,
times the value set over what it gives now. Where the factor is 0 (the first step of a
warmup from 0, the end of a linear decay) the value set becomes the base. Any other
scheduler gets ``base_lrs = lr``: chainable ones (StepLR, ExponentialLR, ...) go on from
the param groups' lr, which now hold it. OneCycleLR and CyclicLR compute every step's lr
from their own bounds, whatever the groups hold: a set lr would last one step, so lr is
refused there, with the reason (``why_fixed``).
"""

from __future__ import annotations

from typing import Any

from ..protocol.errors import ConfigError

OPTIMIZER_HPARAMS = ("lr", "momentum", "weight_decay")
# Schedulers that set lr from their own bounds at every step (and OneCycleLR momentum too).
OWN_LR = ("OneCycleLR", "CyclicLR")


class OptimizerBinding:
    """Binds lr/momentum/weight_decay to an optimizer's param groups.

    Group-relative settings survive a change: a group whose lr was 0.1x the first group's
    stays 0.1x, and groups created without weight decay (biases, norms) keep none.
    """

    def __init__(self, optimizer: Any, scheduler: Any | None = None) -> None:
        self.optimizer = optimizer
        self.scheduler = scheduler
        groups = optimizer.param_groups
        if not groups:
            raise ConfigError("the optimizer has no param groups")
        base = groups[0]
        # The groups' ratios from the scheduler's base lrs where it has them: a warmup from
        # 0 leaves every group's lr at 0 at the start, which would hide them.
        lrs = list(getattr(scheduler, "base_lrs", None) or [g["lr"] for g in groups])
        if len(lrs) != len(groups):
            lrs = [g["lr"] for g in groups]
        self._lr_ratio = [lr / lrs[0] if lrs[0] else 1.0 for lr in lrs]
        self._decays = [bool(g.get("weight_decay", 0.0)) or i == 0 for i, g in enumerate(groups)]
        self.momentum_key = (
            "momentum" if "momentum" in base else "betas" if "betas" in base else None
        )

    def why_fixed(self, name: str) -> str:
        """Why ``name`` cannot change under this scheduler ("" if it can)."""
        kind = type(self.scheduler).__name__
        if kind in OWN_LR and (name == "lr" or (
                name == "momentum" and getattr(self.scheduler, "cycle_momentum", False))):
            return (f"{kind} sets it at every step from its own bounds (max_lr, base_lr): a "
                    "value set would last one step; make those bounds a hyper-parameter "
                    "of your own instead")
        return ""

    def supported(self) -> list[str]:
        names = ["lr"]
        if self.momentum_key is not None:
            names.append("momentum")
        if "weight_decay" in self.optimizer.param_groups[0]:
            names.append("weight_decay")
        return names

    def read(self) -> dict[str, Any]:
        g = self.optimizer.param_groups[0]
        out: dict[str, Any] = {"lr": float(g["lr"])}
        if self.momentum_key == "momentum":
            out["momentum"] = float(g["momentum"])
        elif self.momentum_key == "betas":
            out["momentum"] = float(g["betas"][0])
        if "weight_decay" in g:
            out["weight_decay"] = float(g["weight_decay"])
        return out

    def apply(self, changed: dict[str, Any]) -> None:
        groups = self.optimizer.param_groups
        if "lr" in changed:
            lr = float(changed["lr"])
            for g, ratio in zip(groups, self._lr_ratio, strict=True):
                g["lr"] = lr * ratio
            # A scheduler recomputes lr from base_lrs: move those too, or it undoes the change.
            if self.scheduler is not None and hasattr(self.scheduler, "base_lrs"):
                self.scheduler.base_lrs = self._bases(lr)
                # What get_last_lr() reports (HF logs it as the step's learning_rate).
                self.scheduler._last_lr = [g["lr"] for g in groups]
        if "momentum" in changed and self.momentum_key is not None:
            m = float(changed["momentum"])
            for g in groups:
                if self.momentum_key == "momentum":
                    g["momentum"] = m
                else:
                    g["betas"] = (m, *tuple(g["betas"])[1:])
        if "weight_decay" in changed:
            wd = float(changed["weight_decay"])
            for g, decays in zip(groups, self._decays, strict=True):
                if decays:
                    g["weight_decay"] = wd

    def _bases(self, lr: float) -> list[float]:
        """The scheduler's new base lrs for a set ``lr`` (see the module's docstring)."""
        sched = self.scheduler
        lambdas = getattr(sched, "lr_lambdas", None)
        step = getattr(sched, "last_epoch", None)
        out = []
        for i, ratio in enumerate(self._lr_ratio):
            factor = 0.0
            if lambdas is not None and step is not None and i < len(lambdas):
                factor = float(lambdas[i](step))
            out.append(lr * ratio / factor if factor > 0 else lr * ratio)
        return out
