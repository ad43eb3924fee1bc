"""Several `Trainer` runs in lockstep (docs/experiments.md, 'Shared causal-LM recipe'): one optimizer step of
each in turn, round robin, as the scripts' comparisons need so that step times compare on a shared machine.
Each run's `train()` goes in a thread of its own and a `TrainerCallback` passes the turn on at every step
start: only one run computes at any time, and everything from one of its step starts to the next (the
batch, the step, logging, callbacks) is its own. Runs that finish leave the rotation; a run can join it
while the others train (`add`, e.g. from a callback of another run)."""

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
    the wall seconds of each of its steps (from its step start to its step end, before the run's other
    callbacks act on that end)."""

    def __init__(self, trainers: dict[str, Trainer]):
        self.trainers, self.order, self.active, self.joining, self.turn = {}, [], [], [], {}
        self.seconds: dict[str, list[float]] = {}
        self.errors: list[BaseException] = []
        self.threads: list[threading.Thread] = []
        self._holder, self._lock, self._start = None, threading.Lock(), {}
        for name, trainer in trainers.items():
            self._enrol(name, trainer)

    def _enrol(self, name: str, trainer: Trainer, joining: bool = False) -> None:
        with self._lock:
            if name in self.trainers:
                raise ValueError(f"a run named {name!r} is already in the rotation")
            self.trainers[name] = trainer
            self.order.append(name)
            (self.joining if joining else self.active).append(name)
            self.turn[name] = threading.Event()
            self.seconds[name] = []
        trainer.callback_handler.callbacks.insert(0, _Turn(self, name))  # first: its timer excludes the rest

    def add(self, name: str, trainer: Trainer) -> None:
        """Join `trainer` to a rotation that is training, last in the order: the run computing now takes
        its next step first, then the rotation goes on with the new run in it (so after a run adds one at
        the end of its step k, every run reaches step k + 1 before the new one takes its first step)."""
        self._enrol(name, trainer, joining=True)
        thread = threading.Thread(target=self._run, args=(name,), name=name)
        self.threads.append(thread)
        thread.start()

    def _pass_turn(self, name: str) -> None:
        """Give the turn to the run after `name` that is still active (none left: nothing)."""
        with self._lock:
            if not self.active and not self.joining:
                return
            later = [other for other in self.order if other in self.active]
            position = self.order.index(name)
            following = [o for o in later if self.order.index(o) > position] + later + self.joining
            self.active += self.joining
            self.joining = []
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
        self.threads = [threading.Thread(target=self._run, args=(name,), name=name) for name in self.order]
        for thread in self.threads:
            thread.start()
        joined = 0
        while joined < len(self.threads):  # `add` appends while an earlier run trains
            self.threads[joined].join()
            joined += 1
        if self.errors:
            raise self.errors[0]
        return self.seconds
