"""Resuming a run that grew heads: the model takes the head counts of the checkpoint it loads, and an
optimizer built at the initial size follows it.

Two ways, both on complete checkpoints only (`checkpoints.py`): `resume_growth_training(trainer)` checks the
checkpoint, resizes the model to its marker's head counts and calls `trainer.train(resume_from_checkpoint=)`;
the stock `trainer.train(resume_from_checkpoint=True)` works too: `IncrtGrowthCallback.on_init_end` moved
incomplete checkpoints out of its way (`hide_incomplete_checkpoints`) and made the model resize to the
weights the Trainer loads (`follow_saved_head_counts`).
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path

import torch
from transformers import Trainer
from transformers.trainer_utils import TrainOutput
from transformers.utils import logging

from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtPreTrainedModel
from geoformers.training.checkpoints import checkpoint_problem, latest_complete_checkpoint, read_marker
from geoformers.training.optim import sync_optimizer_with_model

# A child of transformers' library logger, as in growth.py.
logger = logging.get_logger(f"transformers.{__name__}")

_FOLLOWING: weakref.WeakSet = weakref.WeakSet()  # models and optimizers that follow loaded head counts


def _heads_in_state_dict(model: DDCLIncrtPreTrainedModel, state_dict, prefix: str) -> list[int]:
    """Per-layer head counts of the weights in `state_dict` (the model's count where it holds none)."""
    names = {id(module): name for name, module in model.named_modules()}
    counts = []
    for layer in model.base_model.layers:
        heads = layer.attention.heads
        path = f"{prefix}{names[id(heads)]}."
        indices = {int(key[len(path) :].split(".", 1)[0]) for key in state_dict if key.startswith(path)}
        counts.append(max(indices) + 1 if indices else len(heads))
    return counts


def _resize_to_state_dict(model, state_dict, prefix, *args) -> None:
    """load_state_dict pre-hook: resize the heads to those of the weights about to be loaded."""
    counts = _heads_in_state_dict(model, state_dict, prefix)
    if counts != list(model.config.num_heads):
        logger.info(f"INCRT: resizing heads {list(model.config.num_heads)} -> {counts} to load saved weights")
        model.resize_heads(counts)


def follow_saved_head_counts(
    model: DDCLIncrtPreTrainedModel, optimizer: torch.optim.Optimizer | None = None
) -> None:
    """Let the stock `Trainer.train(resume_from_checkpoint=...)` resume a run that grew heads: the Trainer
    loads the checkpoint's weights with `model.load_state_dict` (before any callback event), then the
    optimizer state with `optimizer.load_state_dict`. The model is made to resize its heads to the weights it
    loads, and `optimizer` (one passed to the Trainer, built at the initial size) to re-synchronise its groups
    with the model (`sync_optimizer_with_model`) before it gives or loads a state dict. Idempotent."""
    if model not in _FOLLOWING:
        model.register_load_state_dict_pre_hook(_resize_to_state_dict)
        _FOLLOWING.add(model)
    if optimizer is not None and optimizer not in _FOLLOWING:
        following = weakref.ref(model)

        def sync(optimizer, state_dict=None) -> None:
            if following() is not None:
                sync_optimizer_with_model(optimizer, following())

        # before `state_dict` too: accelerate's optimizer wrapper reloads the optimizer's own state dict
        optimizer.register_state_dict_pre_hook(sync)
        optimizer.register_load_state_dict_pre_hook(sync)
        _FOLLOWING.add(optimizer)


def resume_growth_training(
    trainer: Trainer, checkpoint: str | os.PathLike | None = None, **train_kwargs
) -> TrainOutput:
    """`trainer.train(resume_from_checkpoint=checkpoint)` on a checked complete checkpoint, in one call.

    `checkpoint` defaults to `latest_complete_checkpoint(trainer.args.output_dir)` (kept copies included);
    an incomplete checkpoint raises ValueError. The model is resized to the checkpoint's head counts
    (`resize_heads`; every weight and gate buffer is then overwritten by the checkpoint) and an optimizer
    passed to the Trainer is re-synchronised, also without the callback; the Trainer then restores the
    optimizer, scheduler, RNG and data position, and `IncrtGrowthCallback` its history.
    """
    if not isinstance(trainer, Trainer):
        raise TypeError(f"`trainer` must be a transformers.Trainer, got {type(trainer).__name__}")
    model = trainer.model
    if not isinstance(model, DDCLIncrtPreTrainedModel):
        raise TypeError(f"`trainer.model` must be a DDCL-INCRT model, got {type(model).__name__}")
    if checkpoint is None:
        checkpoint = latest_complete_checkpoint(trainer.args.output_dir)
        if checkpoint is None:
            raise ValueError(f"no complete checkpoint in {trainer.args.output_dir!r}")
    if not Path(checkpoint).is_dir():
        raise ValueError(f"`checkpoint` {str(checkpoint)!r} is not a directory")
    problem = checkpoint_problem(checkpoint)
    if problem is not None:
        raise ValueError(f"`checkpoint` {str(checkpoint)!r} is incomplete: {problem}")
    model.resize_heads(read_marker(checkpoint)["num_heads"])
    if trainer.optimizer is not None:
        sync_optimizer_with_model(trainer.optimizer, model)
    return trainer.train(resume_from_checkpoint=str(checkpoint), **train_kwargs)


__all__ = ["follow_saved_head_counts", "resume_growth_training"]
