"""Optimizer parameter groups for the DDL-mHC hyper-connection parameters (docs/hc_diagnostics.md, "Optimizer
groups").

Every sublayer's maps come from a few static logits and gates (`modeling/ddl_mhc.py`, `HyperConnection`).
They get groups of their own, without weight decay (decay would pull them towards a fixed map, which is a
modelling choice, not a regulariser) and with a learning-rate multiplier:

- `hc_chart`: the static chart logits `res_bias` of H_res = (1 - a) I + a chart(t): lr x 1/6 by default, the
  TBP authors' setting (one logit moves the interval of every later choice of its matrix);
- `hc_gates`: the dynamic gates `pre_gate`, `res_gate`, `write_gate` (mHC's alpha): lr x 1 by default;
- `hc_mix`: the other static map logits, `res_mix_logit` (a; `res_mix_logits` for a three-way mix),
  `write_bias` (beta, or H_post for "add"), `pre_bias` (H_pre) and the read-out `stream_readout.logits`:
  lr x 1 by default.

Everything else goes to `decay` / `no_decay` exactly as transformers' `Trainer.get_decay_parameter_names`
splits it (no decay for biases and norm weights; embeddings and `maps_proj` decay). Parameters are matched by
name, so PEFT-wrapped models and the flat remote-code copy of the model get the same groups; frozen parameters
are left out.
"""

from __future__ import annotations

import math
import re

import torch
from torch import nn
from transformers import Trainer, TrainingArguments
from transformers.trainer_pt_utils import get_parameter_names

DECAY, NO_DECAY, HC_CHART, HC_GATES, HC_MIX = "decay", "no_decay", "hc_chart", "hc_gates", "hc_mix"
# transformers' Trainer.get_decay_parameter_names: no weight decay for these names (and nn.LayerNorm weights).
TRAINER_NO_DECAY_PATTERNS = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]
HC_PATTERNS = {
    HC_CHART: re.compile(r"(?:^|\.)res_bias$"),
    HC_GATES: re.compile(r"(?:^|\.)(?:pre|res|write)_gate$"),
    HC_MIX: re.compile(r"(?:^|\.)(?:res_mix_logits?|write_bias|pre_bias|stream_readout\.logits)$"),
}
DEFAULT_CHART_LR_MULTIPLIER = 1 / 6


def _check_number(name: str, value, positive: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"`{name}` must be a number, got {type(value).__name__} ({value!r})")
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"`{name}` must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")


def hc_parameter_groups(
    model: nn.Module,
    learning_rate: float,
    weight_decay: float,
    *,
    chart_lr_multiplier: float = DEFAULT_CHART_LR_MULTIPLIER,
    gate_lr_multiplier: float = 1.0,
    mix_lr_multiplier: float = 1.0,
) -> list[dict]:
    """Groups `decay`, `no_decay`, `hc_chart`, `hc_gates`, `hc_mix` (module docstring), each tagged with its
    `group_name` and holding the trainable parameters in `named_parameters()` order. Empty groups are kept,
    so every model gets the same five groups (and a saved optimizer state loads into any of them)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
    _check_number("learning_rate", learning_rate, positive=False)
    _check_number("weight_decay", weight_decay, positive=False)
    multipliers = {HC_CHART: chart_lr_multiplier, HC_GATES: gate_lr_multiplier, HC_MIX: mix_lr_multiplier}
    for name, multiplier in zip(
        ("chart_lr_multiplier", "gate_lr_multiplier", "mix_lr_multiplier"), multipliers.values(), strict=True
    ):
        _check_number(name, multiplier, positive=True)
    decay_names = set(get_parameter_names(model, [nn.LayerNorm], TRAINER_NO_DECAY_PATTERNS))
    groups = {
        DECAY: {"group_name": DECAY, "params": [], "lr": learning_rate, "weight_decay": weight_decay},
        NO_DECAY: {"group_name": NO_DECAY, "params": [], "lr": learning_rate, "weight_decay": 0.0},
    }
    for group, multiplier in multipliers.items():
        groups[group] = {
            "group_name": group,
            "params": [],
            "lr": learning_rate * multiplier,
            "weight_decay": 0.0,
        }
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        group = next((group for group, pattern in HC_PATTERNS.items() if pattern.search(name)), None)
        if group is None:
            group = DECAY if name in decay_names else NO_DECAY
        groups[group]["params"].append(parameter)
    return list(groups.values())


def make_ddl_mhc_optimizer(
    model: nn.Module,
    args: TrainingArguments,
    *,
    chart_lr_multiplier: float = DEFAULT_CHART_LR_MULTIPLIER,
    gate_lr_multiplier: float = 1.0,
    mix_lr_multiplier: float = 1.0,
) -> torch.optim.Optimizer:
    """The optimizer `args.optim` names (AdamW by default, with args' betas and epsilon) over
    `hc_parameter_groups(model, args.learning_rate, args.weight_decay, ...)`.

    Pass it as `Trainer(..., optimizers=(make_ddl_mhc_optimizer(model, args), None))`: the Trainer builds its
    learning-rate schedule over these groups, which scales every group's own base learning rate alike, so the
    multipliers hold at every step.
    """
    if not isinstance(args, TrainingArguments):
        raise TypeError(f"`args` must be a transformers.TrainingArguments, got {type(args).__name__}")
    optimizer_cls, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    if {"params", "model", "optimizer_dict"} & optimizer_kwargs.keys():
        raise ValueError(f"`args.optim`={args.optim!r} builds its own parameter groups; use an Adam-type one")
    groups = hc_parameter_groups(
        model,
        args.learning_rate,
        args.weight_decay,
        chart_lr_multiplier=chart_lr_multiplier,
        gate_lr_multiplier=gate_lr_multiplier,
        mix_lr_multiplier=mix_lr_multiplier,
    )
    return optimizer_cls(groups, **optimizer_kwargs)


__all__ = ["hc_parameter_groups", "make_ddl_mhc_optimizer"]
