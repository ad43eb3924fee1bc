"""Callback metrics for every `report_to` integration (docs/hc_diagnostics.md, 'Reaching TensorBoard, W&B and
the other integrations').

transformers' `Trainer.log` hands one `logs` dict to each callback's `on_log`, in the order of the callback
list: `DefaultFlowCallback`, then the `report_to` integrations (TensorBoard, W&B, MLflow, ...), then the
callbacks passed to the Trainer, then the progress printer. A metric that a callback merges into `logs` (the
INCRT gate statistics of `IncrtGrowthCallback`, the diagnostics of `HyperConnectionDiagnosticsCallback`)
therefore reaches the printed logs and `state.log_history` but no integration, which has already written
the record. `report_callback_metrics(trainer)` moves the integration callbacks behind every other callback
with the Trainer's own `pop_callback` / `add_callback`, so they write the merged record; nothing else changes.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from transformers import TrainerCallback, TrainingArguments
from transformers.integrations.integration_utils import (
    INTEGRATION_TO_CALLBACK,
    get_reporting_integration_callbacks,
)
from transformers.trainer_callback import TrainerState
from transformers.utils import logging

if TYPE_CHECKING:
    from transformers import Trainer

logger = logging.get_logger(f"transformers.{__name__}")

# callbacks that ran before every integration when `report_callback_metrics` last reordered their Trainer
_BEFORE_INTEGRATIONS: weakref.WeakSet = weakref.WeakSet()


def report_callback_metrics(trainer: Trainer) -> Trainer:
    """Let the `report_to` integrations see what the other callbacks merge into the log record: move every
    integration callback (of transformers' `INTEGRATION_TO_CALLBACK`) behind the others, keeping their order.
    Call it after the last `add_callback`; returns `trainer`."""
    from transformers import Trainer  # imported here: `geoformers.training` loads this module eagerly

    if not isinstance(trainer, Trainer):
        raise TypeError(f"`trainer` must be a transformers.Trainer, got {type(trainer).__name__}")
    integration_classes = tuple(INTEGRATION_TO_CALLBACK.values())
    callbacks = list(trainer.callback_handler.callbacks)
    for callback in callbacks:
        if isinstance(callback, integration_classes):
            trainer.add_callback(trainer.pop_callback(callback))
        else:
            _BEFORE_INTEGRATIONS.add(callback)
    return trainer


def warn_if_unreported(
    callback: TrainerCallback, args: TrainingArguments, state: TrainerState, metrics: str
) -> None:
    """Warn (on the main process, at the start of training) when `args.report_to` names integrations that
    `callback`'s `metrics` would miss: its Trainer was not passed to `report_callback_metrics` after the
    callback was added."""
    integrations = get_reporting_integration_callbacks(args.report_to)
    if integrations and state.is_world_process_zero and callback not in _BEFORE_INTEGRATIONS:
        names = ", ".join(integration.__name__ for integration in integrations)
        logger.warning(
            f"{type(callback).__name__}: the {metrics} reach the printed logs and `log_history` but not the "
            f"`report_to` integrations ({names}), which log before the Trainer's other callbacks; call "
            "`geoformers.training.report_callback_metrics(trainer)` before `trainer.train()`"
        )


__all__ = ["report_callback_metrics", "warn_if_unreported"]
