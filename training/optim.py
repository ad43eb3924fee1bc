"""Optimizer parameter groups for DDCL-INCRT and their upkeep while heads grow and are pruned
(docs/ddcl_incrt.md, 'Growth and pruning').

Two-timescale training (DDCL-Attention): prototypes learn at `prototype_lr_multiplier` times the encoder's
learning rate. No weight decay on biases, LayerNorm weights, prototypes and temperatures (`rho`).

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
from transformers import PreTrainedModel, Trainer, TrainingArguments
from transformers.trainer_pt_utils import get_parameter_names

DECAY, NO_DECAY, PROTOTYPES = "decay", "no_decay", "prototypes"
# The Trainer's own no-decay name patterns (Trainer.get_decay_parameter_names), plus the DDCL temperature.
NO_DECAY_PATTERNS = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)",
                     r"prototype_bank\.rho$"]
PROTOTYPE_PATTERN = re.compile(r"prototype_bank\.prototypes$")
HEAD_PARAMETER = re.compile(r"^(?P<layer>.*\.heads\.)(?P<head>\d+)(?P<rest>\..+)$")


def growth_parameter_groups(
    model: nn.Module, *, learning_rate: float, weight_decay: float, prototype_lr_multiplier: float = 10.0
) -> list[dict]:
    """Parameter groups `decay`, `no_decay` and `prototypes` (lr = learning_rate * prototype_lr_multiplier,
    no decay), each in `named_parameters()` order and tagged with its `group_name`; frozen parameters are
    left out. Empty groups are kept, so every model of this type gets the same three groups."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
    for name, value in (("learning_rate", learning_rate), ("weight_decay", weight_decay),
                        ("prototype_lr_multiplier", prototype_lr_multiplier)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"`{name}` must be a number >= 0, got {value!r}")
    if prototype_lr_multiplier == 0:
        raise ValueError("`prototype_lr_multiplier` must be > 0 (0 would freeze the prototypes)")
    decay_names = set(get_parameter_names(model, [nn.LayerNorm], NO_DECAY_PATTERNS))
    groups = {
        DECAY: {"group_name": DECAY, "params": [], "lr": learning_rate, "weight_decay": weight_decay},
        NO_DECAY: {"group_name": NO_DECAY, "params": [], "lr": learning_rate, "weight_decay": 0.0},
        PROTOTYPES: {"group_name": PROTOTYPES, "params": [], "lr": learning_rate * prototype_lr_multiplier,
                     "weight_decay": 0.0},
    }
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        if PROTOTYPE_PATTERN.search(name):
            groups[PROTOTYPES]["params"].append(parameter)
        elif name in decay_names:
            groups[DECAY]["params"].append(parameter)
        else:
            groups[NO_DECAY]["params"].append(parameter)
    return list(groups.values())


def make_optimizer(
    model: PreTrainedModel, args: TrainingArguments, *, prototype_lr_multiplier: float = 10.0
) -> torch.optim.Optimizer:
    """The optimizer `args.optim` names (AdamW by default, with args' betas and epsilon) over
    `growth_parameter_groups(model, learning_rate=args.learning_rate, weight_decay=args.weight_decay, ...)`.

    Pass it as `Trainer(..., optimizers=(make_optimizer(model, args), None))`; the Trainer then builds its
    learning-rate schedule over these groups (each group keeps its own base learning rate).
    """
    if not isinstance(args, TrainingArguments):
        raise TypeError(f"`args` must be a transformers.TrainingArguments, got {type(args).__name__}")
    optimizer_cls, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    if {"params", "model", "optimizer_dict"} & optimizer_kwargs.keys():
        raise ValueError(f"`args.optim`={args.optim!r} builds its own parameter groups; use an Adam-type one")
    groups = growth_parameter_groups(model, learning_rate=args.learning_rate, weight_decay=args.weight_decay,
                                     prototype_lr_multiplier=prototype_lr_multiplier)
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


__all__ = ["growth_parameter_groups", "make_optimizer", "sync_optimizer_with_model"]
