"""AdamW (decoupled weight decay, Loshchilov & Hutter 2019, arXiv 1711.05101) and its schedule.

The learning rate of optimiser step s during trainer iteration i of I (``trainer.iterations``)::

    warm-up   w(s) = min(1, (s + 1) / W)                      (W = optimizer.warmupSteps; 1 if 0)
    constant  d(i) = 1
    linear    d(i) = 1 - i / I
    cosine    d(i) = (1 + cos(pi i / I)) / 2
    lr        = lr_peak * w(s) * d(i)

Warm-up counts optimiser steps (mini-batches); the decay follows iterations, which the trainer
numbers, so a resumed run continues the same curve.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from aflowrl.config.learner import OptimizerSpec


def learning_rate(spec: OptimizerSpec, step: int, iteration: int, iterations: int) -> float:
    """lr_peak * w(step) * d(iteration) (module docstring)."""
    warmup = min(1.0, (step + 1) / spec.warmup_steps) if spec.warmup_steps > 0 else 1.0
    progress = min(1.0, max(0.0, iteration / max(1, iterations)))
    if spec.scheduler == "linear":
        decay = 1.0 - progress
    elif spec.scheduler == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        decay = 1.0
    return spec.lr * warmup * decay


def make_optimizer(params: Iterable[torch.nn.Parameter], spec: OptimizerSpec) -> torch.optim.AdamW:
    """AdamW over ``params`` with the spec's betas, epsilon and weight decay."""
    return torch.optim.AdamW(
        list(params),
        lr=spec.lr,
        betas=(spec.betas[0], spec.betas[1]),
        eps=spec.eps,
        weight_decay=spec.weight_decay,
    )
