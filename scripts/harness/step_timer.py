"""Wall seconds of every optimizer step of a `Trainer` run (a `TrainerCallback`): the time from one step's
end to the next one's, so batching, the forward and backward, clipping, the optimizer, the schedule and the
Trainer's own bookkeeping are all in it, as they are in a user's run."""

import time

import torch
from transformers import TrainerCallback


class StepTimer(TrainerCallback):
    """`seconds[i]`: wall seconds of step i + 1 (the first from `on_train_begin`). On CUDA each step end
    waits for the device."""

    def __init__(self):
        self.seconds: list[float] = []
        self._last = None

    def _now(self) -> float:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        return time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        self.seconds, self._last = [], self._now()

    def on_step_end(self, args, state, control, **kwargs):
        now = self._now()
        self.seconds.append(now - self._last)
        self._last = now
