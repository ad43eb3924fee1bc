"""Several `Trainer` runs in lockstep (docs/experiments.md, 'Shared causal-LM recipe'): one optimizer step of
each in turn, round robin, as the scripts' comparisons need so that step times compare on a shared machine.
Each run's `train()` goes in a thread of its own and a `TrainerCallback` passes the turn on at every step
start: only one run computes at any time, and everything from one of its step starts to the next (the
batch, the step, logging, callbacks) is its own. Runs that finish leave the rotation."""

import threading
import time

from transformers import Trainer, TrainerCallback


class _Turn(TrainerCallback):
    def __init__(self, rotation: "RoundRobin", name: str):
        self.rotation, self.name = rotation, name

    def on_step_begin(self, args, state, control, **kwargs):
        self.rotation._step_begin(self.name)

    def on_step_end(self, args, state, control, **kwargs):
        self.rotation._step_end(self.name)


class RoundRobin:
    """`RoundRobin(trainers).train()`: every trainer's `train()` in turns of one step; `seconds[name]` are
    the wall seconds of each of its steps (from its step start to its step end)."""

    def __init__(self, trainers: dict[str, Trainer]):
        self.trainers, self.order = trainers, list(trainers)
        self.active = list(self.order)
        self.turn = {name: threading.Event() for name in self.order}
        self.seconds: dict[str, list[float]] = {name: [] for name in self.order}
        self.errors: list[BaseException] = []
        self._holder, self._lock, self._start = None, threading.Lock(), {}
        for name, trainer in trainers.items():
            trainer.add_callback(_Turn(self, name))

    def _pass_turn(self, name: str) -> None:
        """Give the turn to the run after `name` that is still active (none left: nothing)."""
        with self._lock:
            if not self.active:
                return
            later = [other for other in self.order if other in self.active]
            position = self.order.index(name)
            following = [o for o in later if self.order.index(o) > position] + later
            self._holder = following[0]
            self.turn[self._holder].set()

    def _step_begin(self, name: str) -> None:
        if self._holder == name and self._start.get(name) is not None:
            self._pass_turn(name)  # this run's previous step (and what followed it) is over
        self.turn[name].wait()
        self.turn[name].clear()
        self._start[name] = time.perf_counter()

    def _step_end(self, name: str) -> None:
        self.seconds[name].append(time.perf_counter() - self._start[name])

    def _run(self, name: str) -> None:
        try:
            self.trainers[name].train()
        except BaseException as error:  # reported after every thread ended
            self.errors.append(error)
        finally:
            with self._lock:
                self.active.remove(name)
            if self._holder == name:
                self._pass_turn(name)

    def train(self) -> dict[str, list[float]]:
        self._holder = self.order[0]
        self.turn[self._holder].set()
        threads = [threading.Thread(target=self._run, args=(name,), name=name) for name in self.order]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self.errors:
            raise self.errors[0]
        return self.seconds
