"""Optimizer parameter groups of both models, and their upkeep while DDCL-INCRT heads grow and are pruned.

Groups (each without weight decay but `decay`, each with its own learning-rate multiplier):

- `decay` / `no_decay`: every other parameter, split as transformers' `Trainer.get_decay_parameter_names`
  splits it (no decay for biases and norm weights), plus no decay for the DDCL temperatures `rho`;
- `prototypes` (DDCL-INCRT, docs/ddcl_incrt.md): two-timescale training (DDCL-Attention), lr x 10 by default;
- `hc_chart`, `hc_gates`, `hc_mix` (DDL-mHC, docs/hc_diagnostics.md, "Optimizer groups"): the static chart
  logits `res_bias` (lr x 1/6 by default, the TBP authors' setting), the dynamic gates (mHC's alpha) and the
  other static map logits (lr x 1 each). Decay would pull them towards a fixed map, a modelling choice.

Parameters are matched by name, so PEFT-wrapped models and the remote-code copy get the same groups; frozen
parameters are left out; empty groups are kept, so every model gets the same six groups.

The Trainer builds its optimizer once, so after every grow/prune `sync_optimizer_with_model` rewrites each
group's `params` in the canonical order of `model.named_parameters()`: surviving parameters keep their Adam
moments, removed ones lose theirs, new head parameters join the group of the same parameter of another head
of their layer (so they train from the next step at that group's scheduled learning rate). Canonical order
matters on resume: the Trainer loads `optimizer.pt`, whose state is indexed by position, into a fresh
optimizer built from `named_parameters()` of the reloaded (grown) model.
"""

from __future__ import annotations

import re

import torch
from torch import nn
from transformers import Trainer, TrainingArguments
from transformers.trainer_pt_utils import get_parameter_names

from geoformers.models.config_validation import check_number

# transformers' Trainer.get_decay_parameter_names (and nn.LayerNorm weights), plus the DDCL temperature
NO_DECAY_PATTERNS = [
    r"bias",
    r"layernorm",
    r"rmsnorm",
    r"(?:^|\.)norm(?:$|\.)",
    r"_norm(?:$|\.)",
    r"prototype_bank\.rho$",
]
GROUP_PATTERNS = {
    "prototypes": re.compile(r"prototype_bank\.prototypes$"),
    "hc_chart": re.compile(r"(?:^|\.)res_bias$"),
    "hc_gates": re.compile(r"(?:^|\.)(?:pre|res|write)_gate$"),
    "hc_mix": re.compile(r"(?:^|\.)(?:res_mix_logits?|write_bias|pre_bias|stream_readout\.logits)$"),
}
HEAD_PARAMETER = re.compile(r"^(?P<layer>.*\.heads\.)(?P<head>\d+)(?P<rest>\..+)$")


def parameter_groups(
    model: nn.Module,
    learning_rate: float,
    weight_decay: float,
    *,
    prototype_lr_multiplier: float = 10.0,
    chart_lr_multiplier: float = 1 / 6,
    gate_lr_multiplier: float = 1.0,
    mix_lr_multiplier: float = 1.0,
) -> list[dict]:
    """Groups `decay`, `no_decay`, `prototypes`, `hc_chart`, `hc_gates`, `hc_mix` (module docstring), each
    tagged with its `group_name` and holding the trainable parameters in `named_parameters()` order."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
    check_number("learning_rate", learning_rate, 0.0)
    check_number("weight_decay", weight_decay, 0.0)
    multipliers = {
        "prototypes": ("prototype_lr_multiplier", prototype_lr_multiplier),
        "hc_chart": ("chart_lr_multiplier", chart_lr_multiplier),
        "hc_gates": ("gate_lr_multiplier", gate_lr_multiplier),
        "hc_mix": ("mix_lr_multiplier", mix_lr_multiplier),
    }
    groups = {
        "decay": {"group_name": "decay", "params": [], "lr": learning_rate, "weight_decay": weight_decay},
        "no_decay": {"group_name": "no_decay", "params": [], "lr": learning_rate, "weight_decay": 0.0},
    }
    for group, (argument, multiplier) in multipliers.items():
        check_number(argument, multiplier, 0.0, low_open=True)  # 0 would freeze the group
        lr = learning_rate * multiplier
        groups[group] = {"group_name": group, "params": [], "lr": lr, "weight_decay": 0.0}
    decay_names = set(get_parameter_names(model, [nn.LayerNorm], NO_DECAY_PATTERNS))
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        group = next((group for group, pattern in GROUP_PATTERNS.items() if pattern.search(name)), None)
        if group is None:
            group = "decay" if name in decay_names else "no_decay"
        groups[group]["params"].append(parameter)
    return list(groups.values())


def make_optimizer(model: nn.Module, args: TrainingArguments, **lr_multipliers) -> torch.optim.Optimizer:
    """The optimizer `args.optim` names (AdamW by default, with args' betas and epsilon) over
    `parameter_groups(model, args.learning_rate, args.weight_decay, **lr_multipliers)`.

    Pass it as `Trainer(..., optimizers=(make_optimizer(model, args), None))`: the Trainer builds its
    learning-rate schedule over these groups, which scales every group's own base learning rate alike, so the
    multipliers hold at every step.
    """
    if not isinstance(args, TrainingArguments):
        raise TypeError(f"`args` must be a transformers.TrainingArguments, got {type(args).__name__}")
    optimizer_cls, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    if {"params", "model", "optimizer_dict"} & optimizer_kwargs.keys():
        raise ValueError(f"`args.optim`={args.optim!r} builds its own parameter groups; use an Adam-type one")
    groups = parameter_groups(model, args.learning_rate, args.weight_decay, **lr_multipliers)
    return optimizer_cls(groups, **optimizer_kwargs)


def _sibling_group(name: str, group_of_name: dict[str, int]) -> int | None:
    """Group of the same parameter in another head of the same layer (`...heads.<j>.<rest>`), if any."""
    match = HEAD_PARAMETER.match(name)
    if match is None:
        return None
    sibling = re.compile(re.escape(match["layer"]) + r"\d+" + re.escape(match["rest"]) + "$")
    return next((group for other, group in group_of_name.items() if sibling.match(other)), None)


@torch.no_grad()
def sync_optimizer_with_model(optimizer: torch.optim.Optimizer, model: nn.Module) -> tuple[list[str], int]:
    """Make `optimizer` (a torch optimizer, or accelerate's wrapper around one) hold exactly the model's
    trainable parameters after heads were grown or pruned; returns (added parameter names, number removed).

    Each group keeps its hyper-parameters (and scheduled lr); its params are rewritten in the canonical
    `model.named_parameters()` order. Known parameters stay in their group with their state; state of
    parameters no longer in the model is deleted; a new head parameter joins its sibling's group (the same
    parameter of another head in that layer); one whose siblings the optimizer does not hold stays out like
    them, as do other parameters the optimizer never held.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
    if not hasattr(optimizer, "param_groups") or not hasattr(optimizer, "state"):
        raise TypeError(f"`optimizer` must be a torch optimizer, got {type(optimizer).__name__}")
    groups = optimizer.param_groups
    group_of_id = {id(p): index for index, group in enumerate(groups) for p in group["params"]}
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    group_of_name = {name: group_of_id[id(p)] for name, p in named if id(p) in group_of_id}
    new_params: list[list[torch.Tensor]] = [[] for _ in groups]
    added = []
    for name, parameter in named:
        group = group_of_name.get(name)
        if group is None and HEAD_PARAMETER.match(name):
            group = _sibling_group(name, group_of_name)
            if group is not None:
                added.append(name)
        if group is not None:
            new_params[group].append(parameter)
    kept = {id(p) for params in new_params for p in params}
    removed = [p for group in groups for p in group["params"] if id(p) not in kept]
    for parameter in removed:
        optimizer.state.pop(parameter, None)
    for group, params in zip(groups, new_params, strict=True):
        group["params"] = params
    return added, len(removed)


__all__ = ["make_optimizer", "parameter_groups", "sync_optimizer_with_model"]
