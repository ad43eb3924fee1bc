"""Row/column error of the approximate doubly-stochastic charts during `Trainer` training (`birkhoff.py`).

Sinkhorn is the one chart that is not exact: after its fixed iteration count its rows miss 1 by an amount
that grows with the scale of the logits (the table beside `SINKHORN_DEFAULT_ITERS` in `birkhoff.py`), and
training can push the logits there. `ChartViolationCallback` watches every Sinkhorn chart the model computes
(`register_chart_observer`), keeps the worst max |row/column sum - 1| since the previous log record without a
host sync per chart, merges it into the Trainer's log records as `chart/sinkhorn_violation`, and warns
through transformers' logging when it exceeds `tolerance`. Charts traced by torch.compile are not seen.
"""

from __future__ import annotations

import torch
from transformers import TrainerCallback, TrainingArguments
from transformers.trainer_callback import TrainerControl, TrainerState
from transformers.utils import logging

from geoformers.modeling.ops.charts import ds_violation, register_chart_observer

logger = logging.get_logger(__name__)

LOG_KEY = "chart/sinkhorn_violation"


class ChartViolationCallback(TrainerCallback):
    """Log the worst Sinkhorn row/column error of each logging interval; warn above `tolerance`."""

    def __init__(self, tolerance: float = 1e-3):
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not tolerance >= 0:
            raise ValueError(f"`tolerance` must be a number >= 0, got {tolerance!r}")
        self.tolerance = float(tolerance)
        self.worst: torch.Tensor | None = None
        self._handle = None

    def observe(self, method: str, matrices: torch.Tensor) -> None:
        """Chart observer: fold this chart's worst error into the running maximum (stays on the device)."""
        if method != "sinkhorn" or matrices.numel() == 0:
            return
        worst = ds_violation(matrices).max()
        self.worst = worst if self.worst is None else torch.maximum(self.worst, worst)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if self._handle is None:
            self._handle = register_chart_observer(self.observe)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, logs=None, **kwargs
    ):
        """Merge the interval's worst error into the log record and start a new interval."""
        if self.worst is None or logs is None:
            return
        worst, self.worst = float(self.worst), None
        logs[LOG_KEY] = worst
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1][LOG_KEY] = worst
        if worst > self.tolerance:
            logger.warning(
                f"step {state.global_step}: Sinkhorn charts miss doubly-stochastic by up to {worst:.3g} "
                f"(|row/column sum - 1|), above the tolerance {self.tolerance:g}; an exact chart "
                "(hc_chart='rtbp' or 'tbp') keeps the mixing doubly stochastic"
            )
