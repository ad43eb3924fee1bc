"""The growth recipe of the DDCL-INCRT experiment scripts on the stock `Trainer`.

Growth recipe (`run_growth_training`, a project choice; the papers do not say when to calibrate), one
`Trainer` whose `IncrtGrowthCallback(start_step=pre_growth_steps)` waits for the warm-up:

1. pre-growth: the initial heads train for `pre_growth_steps` with no gate. At initialisation W_Q, W_K are
   N(0, initializer_range^2): A_sym is a random-like matrix with many eigenvalues of similar size, and the
   first Adam steps enlarge ||A_sym||_F about tenfold, so a gate acting from step 0 grows heads until
   `max_heads` (with a theta_w calibrated there it also stays below every later lambda_max);
2. growth: `IncrtGrowthCallback` checks every `check_every` steps, by default (the config's relative rule)
   against theta_w = gate_calibration_factor x ||A_sym||_F of each check, which follows the spectrum as it
   grows during training (`--gate_threshold calibrated`: the author's theta_w, calibrated once on the
   trained heads and then fixed; with it the CoV-2, SST-2 and non-stationary runs grew to `max_heads`).
   The learning rate follows one `lr_scheduler_type` schedule (with `warmup_steps`) over the whole run.

With `gate_window_steps`, the callback has `regrow=True` and each check draws its gate batch from the rows of
the last `gate_window_steps` steps (`IncrtGrowthCallback.gate_rows`). With `window_steps` instead the run is
split: pre-growth, then consecutive windows, each a `Trainer` with a fresh callback that draws its gate
batches from the window's rows only (a time-ordered stream must not show the gate future rows) and may grow
again after a stop (the gate re-armed every window; the windows are fixed in time). One optimizer
(`make_optimizer`) serves every `Trainer`, so Adam moments carry over.

Steps everywhere (histories, probes, events) are global optimizer steps, pre-growth included. Evaluations
(`eval_dataset`) run every `eval_steps` in the last `Trainer`: the whole run, pre-growth included, when there
is one; the last window with `window_steps` (docs/experiments.md, 'Shared recipe').
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from datasets import Dataset
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtForSequenceClassification
from geoformers.training.evaluation import classification_metrics
from geoformers.training.growth import HISTORY_FILE, PLOT_FILE, IncrtGrowthCallback, plot_growth_history
from geoformers.training.optim import make_optimizer

from harness.flags import training_arguments
from harness.printing import GrowthEventPrinter, ProgressBarOnly
from harness.probes import PrototypeProbe
from harness.results import write_json


@dataclass
class GrowthRun:
    """What `run_growth_training` returns; `history` has global steps and `growth_started_at_step`."""

    model: DDCLIncrtForSequenceClassification
    history: dict | None  # None with `growth=False`
    log_history: list[dict] = field(default_factory=list)
    evaluations: list[dict] = field(default_factory=list)
    train_time_s: float = 0.0
    trainer: Trainer | None = None  # the last phase's, e.g. for a final `trainer.evaluate()`


def offset_history(history: dict, offset: int) -> dict:
    """A callback history with its steps moved by `offset` (calibration events included)."""
    shifted = json.loads(json.dumps(history))
    for record in shifted["checks"] + shifted["events"]:
        record["step"] += offset
    if shifted["growth_stopped_at_step"] is not None:
        shifted["growth_stopped_at_step"] += offset
    return shifted


def _merge_window_history(merged: dict | None, window: dict) -> dict:
    """Concatenate the histories of consecutive growth windows (already on global steps)."""
    if merged is None:
        return window
    merged["checks"].extend(window["checks"])
    merged["events"].extend(event for event in window["events"] if event["action"] != "calibrated")
    merged["num_heads"] = window["num_heads"]
    merged["growing"] = window["growing"]
    merged["verdicts"] = window["verdicts"]
    if merged["growth_stopped_at_step"] is None:
        merged["growth_stopped_at_step"] = window["growth_stopped_at_step"]
    return merged


class _GrowthStart(TrainerCallback):
    """At optimizer step `step` of a run that warms up and grows (growth starts there): `on_window(step, end)`
    and a `probe` record, as at the start of a separate growth phase."""

    def __init__(
        self, step: int, end: int, on_window: Callable[[int, int], None] | None, probe: PrototypeProbe | None
    ):
        self.step, self.end, self.on_window, self.probe = step, end, on_window, probe

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step != self.step:
            return
        if self.on_window is not None:
            self.on_window(self.step, self.end)
        if self.probe is not None and self.step % self.probe.every != 0:
            self.probe.record(model, self.step)


def recent_stream_rows(window_steps: int, rows_per_step: int, step: int) -> range:
    """Rows of a sequential stream trained in the last `window_steps` steps before `step` (at step 0: the
    first step's rows)."""
    return range(max(0, step - window_steps) * rows_per_step, max(step, 1) * rows_per_step)


def run_growth_training(
    model: DDCLIncrtForSequenceClassification,
    args: argparse.Namespace,
    train_dataset: Dataset,
    *,
    output_dir: str | os.PathLike,
    eval_dataset: Dataset | None = None,
    probe: PrototypeProbe | None = None,
    print_events: bool = False,
    sequential: bool = False,
    window_steps: int | None = None,
    on_window: Callable[[int, int], None] | None = None,
    gate_window_steps: int | None = None,
    growth: bool = True,
    trainer_class: type[Trainer] | None = None,
    trainer_kwargs: dict | None = None,
) -> GrowthRun:
    """The growth recipe of the module docstring on the stock `Trainer`; writes growth_history.json and its
    plot (global steps) into `output_dir`.

    `args` holds the flags of `harness.flags.experiment_parser`: every `TrainingArguments` field (each phase
    runs on them with its own steps, schedule, data seed, evaluation and, with `sequential`, sampling) and
    the growth and recipe flags. `sequential`: `train_dataset` is a stream of `per_device_train_batch_size`
    rows per step (global step t trains on rows [t * batch_size, (t + 1) * batch_size)). `window_steps`: run
    the growth phase as windows of that many steps; `on_window(start, end)` is called before each (e.g. to
    move the probe's batch). `gate_window_steps` (with `sequential`, not with `window_steps`): one growth
    phase whose gate checks read the rows of the last that many steps. `growth=False`: the same phases with no
    callback (no history). `trainer_class` (default `Trainer`) and `trainer_kwargs` (e.g. a `data_collator`)
    build each phase's trainer.
    """
    continuous = gate_window_steps is not None
    if continuous and (window_steps is not None or not sequential or gate_window_steps < 1):
        raise ValueError(
            "`gate_window_steps` must be >= 1 and needs `sequential=True` and no "
            f"`window_steps`, got gate_window_steps={gate_window_steps}, "
            f"window_steps={window_steps}, sequential={sequential}"
        )
    output_dir = Path(output_dir)
    batch_size = args.per_device_train_batch_size
    optimizer = None  # one for all phases, built from the first phase's arguments
    compute_metrics = classification_metrics() if eval_dataset is not None else None
    if window_steps is None:  # one Trainer; the callback starts growing at pre_growth_steps
        phases = [(0, args.max_steps)]
    else:
        phases = [(0, args.pre_growth_steps)] if args.pre_growth_steps else []
        phases += [
            (start, min(start + window_steps, args.max_steps))
            for start in range(args.pre_growth_steps, args.max_steps, window_steps)
        ]
    run = GrowthRun(model=model, history={})
    merged, window_stops = None, []
    started = time.perf_counter()
    for index, (start, end) in enumerate(phases):
        growing = end > args.pre_growth_steps
        if on_window is not None:
            on_window(start, min(end, args.pre_growth_steps) if start < args.pre_growth_steps else end)
        rows = train_dataset
        if sequential:
            rows = train_dataset.select(range(start * batch_size, end * batch_size))
        last = index == len(phases) - 1
        evaluate = eval_dataset is not None and last
        phase_args = training_arguments(
            args,
            output_dir=str(output_dir),
            max_steps=end - start,
            lr_scheduler_type=args.lr_scheduler_type if window_steps is None else "constant_with_warmup",
            warmup_steps=args.warmup_steps if index == 0 else 0,
            data_seed=(args.seed if args.data_seed is None else args.data_seed) + index,
            train_sampling_strategy="sequential" if sequential else args.train_sampling_strategy,
            logging_steps=min(args.eval_steps, end - start),
            eval_strategy="steps" if evaluate else "no",
            eval_steps=args.eval_steps if evaluate else None,
        )
        if optimizer is None:
            optimizer = make_optimizer(
                model, phase_args, prototype_lr_multiplier=args.prototype_lr_multiplier
            )
        callbacks: list[TrainerCallback] = []
        callback = None
        if growing and growth:
            gate_rows = None
            if continuous:
                gate_rows = partial(recent_stream_rows, gate_window_steps, batch_size)
            callback = IncrtGrowthCallback(
                check_every=args.check_every,
                gate_batch_size=args.gate_batch_size,
                gate_num_tokens=args.gate_num_tokens,
                save_plot=False,
                regrow=continuous or args.regrow,
                gate_rows=gate_rows,
                start_step=max(args.pre_growth_steps - start, 0),
            )
            callbacks.append(callback)
        if print_events:
            callbacks.append(GrowthEventPrinter(callback, step_offset=start))
        if probe is not None:
            probe.step_offset = start
            callbacks.append(probe)
        if start < args.pre_growth_steps < end:  # one Trainer warms up, then grows
            callbacks.append(_GrowthStart(args.pre_growth_steps, end, on_window, probe))
        trainer = (trainer_class or Trainer)(
            model=model,
            args=phase_args,
            train_dataset=rows,
            eval_dataset=eval_dataset if phase_args.eval_strategy != "no" else None,
            compute_metrics=compute_metrics,
            optimizers=(optimizer, None),
            callbacks=callbacks,
            **(trainer_kwargs or {}),
        )
        trainer.remove_callback(PrinterCallback)
        if not phase_args.disable_tqdm:
            trainer.remove_callback(ProgressCallback)
            trainer.add_callback(ProgressBarOnly())
        trainer.train()
        for entry in trainer.state.log_history:
            run.log_history.append({**entry, "step": entry["step"] + start} if "step" in entry else entry)
        if callback is not None:
            window_history = offset_history(callback.history, start)
            window_stops.append(window_history["growth_stopped_at_step"])
            merged = _merge_window_history(merged, window_history)
    run.train_time_s = time.perf_counter() - started
    run.trainer = trainer
    run.evaluations = [
        {"step": entry["step"], "accuracy": entry["eval_accuracy"]}
        for entry in run.log_history
        if "eval_accuracy" in entry
    ]
    if not growth:
        run.history = None
        return run
    merged["growth_started_at_step"] = args.pre_growth_steps
    if window_steps is not None:
        merged.update(window_steps=window_steps, window_stops=window_stops)
    run.history = merged
    output_dir.mkdir(parents=True, exist_ok=True)
    write_json(output_dir / HISTORY_FILE, merged)
    plot_growth_history(merged, output_dir / PLOT_FILE, log_history=run.log_history, last_step=args.max_steps)
    return run
