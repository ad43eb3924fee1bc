"""Shared pieces of the DDCL-INCRT experiment scripts (issue 6): flags, the growth recipe on the stock
`Trainer`, probes, the head-count law, result files and summary tables.

Growth recipe (`run_growth_training`, a project choice; the papers do not say when to calibrate):

1. pre-growth: the initial heads train for `pre_growth_steps` with no gate. At initialisation W_Q, W_K are
   N(0, initializer_range^2): A_sym is a random-like matrix with many eigenvalues of similar size, and the
   first Adam steps enlarge ||A_sym||_F about tenfold, so a gate acting from step 0 grows heads until
   `max_heads` (with a theta_w calibrated there it also stays below every later lambda_max);
2. growth: `IncrtGrowthCallback` checks every `check_every` steps, by default (the config's relative rule)
   against theta_w = gate_calibration_factor x ||A_sym||_F of each check, which follows the spectrum as it
   grows during training (`--gate_threshold calibrated`: the author's theta_w, calibrated once on the
   trained heads and then fixed; with it the CoV-2, SST-2 and non-stationary runs grew to `max_heads`). One
   optimizer (`make_optimizer`) serves every phase, so Adam moments carry over. With `window_steps` the
   growth phase runs as consecutive windows, each a `Trainer` with a fresh callback that draws its gate
   batches from the window's rows only (a time-ordered stream must not show the gate future rows) and may
   grow again after a stop (the gate re-armed every window; the windows are fixed in time). With
   `gate_window_steps` instead, one callback with `regrow=True` runs the whole growth phase and each check
   draws its gate batch from the rows of the last `gate_window_steps` steps (`IncrtGrowthCallback.gate_rows`).

Steps everywhere (histories, probes, events) are global optimizer steps, pre-growth included.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch
import transformers
from datasets import Dataset
from tqdm.auto import tqdm
from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from ..configuration.ddcl_incrt import GATE_RULES, GATE_THRESHOLDS, DDCLIncrtConfig
from ..modeling.ddcl_incrt import DDCLIncrtForSequenceClassification, DDCLIncrtPreTrainedModel
from ..modeling.incrt import deflate, directional_matrix, head_directional_energy, interaction_matrix
from .evaluation import classification_metrics
from .growth import HISTORY_FILE, PLOT_FILE, IncrtGrowthCallback, plot_growth_history
from .optim import make_optimizer

REPO_ROOT = Path(__file__).resolve().parents[1]
EPS = 1e-12

# ---------------------------------------------------------------------------------------------------------
# Command-line flags (each script sets its own defaults with `parser.set_defaults`)
# ---------------------------------------------------------------------------------------------------------


def add_experiment_arguments(parser: argparse.ArgumentParser) -> None:
    """Model, growth and training flags shared by the experiment scripts; names follow DDCLIncrtConfig."""
    model = parser.add_argument_group("model (DDCLIncrtConfig fields)")
    model.add_argument("--hidden_size", type=int, default=64)
    model.add_argument("--num_hidden_layers", type=int, default=1)
    model.add_argument("--head_dim", type=int, default=8)
    model.add_argument("--initial_heads", type=int, default=1, help="heads per layer before growth")
    model.add_argument("--max_heads", type=int, default=None, help="default hidden // head_dim")
    model.add_argument("--num_prototypes", type=int, default=16)
    model.add_argument("--tau_init", type=float, default=1.0)
    model.add_argument("--tau_min", type=float, default=0.05)
    model.add_argument("--prototype_loss_weight", type=float, default=0.1, help="lambda in CE + lambda L_q")
    model.add_argument("--pooling", choices=("cls", "mean"), default="mean")
    model.add_argument("--dropout", type=float, default=0.0, help="hidden and classifier dropout")
    growth = parser.add_argument_group("growth (INCRT gate)")
    growth.add_argument("--pre_growth_steps", type=int, default=200,
                        help="steps the initial heads train before theta_w is calibrated and growth starts")
    growth.add_argument("--check_every", type=int, default=1,
                        help="optimizer steps between gate checks (1: every growth decision is taken on "
                             "nearly the same spectrum; training between checks inflates lambda_max)")
    growth.add_argument("--gate_batch_size", type=int, default=64, help="training rows per gate check")
    growth.add_argument("--gate_num_tokens", type=int, default=512, help="tokens per gate check")
    growth.add_argument("--gate_threshold", choices=GATE_THRESHOLDS, default=None,
                        help="theta_w = factor x ||A_sym||_F at every check (relative) or calibrated once on "
                             "the first checks and then fixed (calibrated, the author's rule); default: the "
                             "config's (relative)")
    growth.add_argument("--gate_rule", choices=GATE_RULES, default=None,
                        help="grow on lambda_max > theta_w (max_only) or the author's bidirectional rule "
                             "(docs/growth_gate.md); default: the config's")
    growth.add_argument("--gate_calibration_factor", type=float, default=0.1)
    growth.add_argument("--gate_prune_factor", type=float, default=0.0, help="phi_g / theta_w; 0: no pruning")
    growth.add_argument("--gate_prune_patience", type=int, default=3)
    training = parser.add_argument_group("training")
    training.add_argument("--max_steps", type=int, default=1000, help="optimizer steps, pre-growth included")
    training.add_argument("--batch_size", type=int, default=32)
    training.add_argument("--learning_rate", type=float, default=3e-3)
    training.add_argument("--prototype_lr_multiplier", type=float, default=10.0)
    training.add_argument("--weight_decay", type=float, default=0.01)
    training.add_argument("--warmup_steps", type=int, default=20, help="linear warm-up of the learning rate")
    training.add_argument("--lr_scheduler_type", default="linear",
                          help="schedule of the growth phase (the pre-growth phase is warm-up + constant)")
    training.add_argument("--eval_steps", type=int, default=250, help="steps between evaluations")
    training.add_argument("--probe_every", type=int, default=25, help="steps between prototype probes")
    training.add_argument("--seed", type=int, default=0, help="model initialisation and data order")
    training.add_argument("--threads", type=int, default=1,
                          help="torch CPU threads (tiny models run fastest on 1)")
    training.add_argument("--progress", action=argparse.BooleanOptionalAction, default=False,
                          help="show the Trainer's progress bar")


def check_experiment_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """parser.error naming the flag for values the Trainer or the recipe would reject late or silently."""
    positive = ("max_steps", "batch_size", "check_every", "gate_batch_size", "eval_steps", "probe_every",
                "threads", "initial_heads")
    for name in positive:
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    for name in ("pre_growth_steps", "warmup_steps"):
        if getattr(args, name) < 0:
            parser.error(f"--{name} must be >= 0, got {getattr(args, name)}")
    if args.pre_growth_steps >= args.max_steps:
        parser.error(f"--pre_growth_steps ({args.pre_growth_steps}) must be < --max_steps ({args.max_steps})")
    for name in ("learning_rate", "prototype_lr_multiplier"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name} must be > 0, got {getattr(args, name)}")
    if not 0 <= args.dropout < 1:
        parser.error(f"--dropout must lie in [0, 1), got {args.dropout}")


def gate_choices(args: argparse.Namespace) -> dict:
    """`--gate_threshold` / `--gate_rule` as config fields, only where given (else the config's defaults)."""
    return {name: getattr(args, name) for name in ("gate_threshold", "gate_rule")
            if getattr(args, name, None) is not None}


def build_model(args: argparse.Namespace, *, vocab_size: int, max_position_embeddings: int,
                num_labels: int, pad_token_id: int = 0) -> DDCLIncrtForSequenceClassification:
    """DDCL-INCRT classifier from the flags of `add_experiment_arguments`, initialised from `args.seed`."""
    config = DDCLIncrtConfig(
        vocab_size=vocab_size, hidden_size=args.hidden_size, num_hidden_layers=args.num_hidden_layers,
        num_heads=args.initial_heads, head_dim=args.head_dim, max_heads=args.max_heads,
        num_prototypes=args.num_prototypes, tau_init=args.tau_init, tau_min=args.tau_min,
        prototype_loss_weight=args.prototype_loss_weight, pooling=args.pooling,
        hidden_dropout_prob=args.dropout, classifier_dropout=args.dropout, type_vocab_size=0,
        max_position_embeddings=max_position_embeddings, num_labels=num_labels, pad_token_id=pad_token_id,
        gate_num_tokens=args.gate_num_tokens, gate_calibration_factor=args.gate_calibration_factor,
        gate_prune_factor=args.gate_prune_factor, gate_prune_patience=args.gate_prune_patience,
        gate_check_every=args.check_every, **gate_choices(args),
    )
    set_seed(args.seed)
    return DDCLIncrtForSequenceClassification(config)


# ---------------------------------------------------------------------------------------------------------
# Callbacks: growth events as they happen, prototype probes
# ---------------------------------------------------------------------------------------------------------


def describe_event(event: dict) -> str:
    """One line per growth-history event, e.g. `step 204: layer 0 grow -> heads [2] (lambda_max ...)`."""
    text = f"step {event['step']}: layer {event['layer']} {event['action']}"
    if event["action"] == "calibrated":
        return f"{text}: theta_w = {event['theta_w']:.4g}"
    if event["action"] == "prune":
        return (f"{text} head {event['head']} -> heads {event['num_heads']} (directional energy "
                f"{event['energy']:.4g} below phi_g for gate_prune_patience checks)")
    relation = ">" if event["lambda_max"] > event["theta_w"] else "<="
    return (f"{text} -> heads {event['num_heads']} (lambda_max {event['lambda_max']:.4g} {relation} theta_w "
            f"{event['theta_w']:.4g})")


class GrowthEventPrinter(TrainerCallback):
    """Print each new growth-history event of `growth` as it happens, and every evaluation's accuracy
    (tqdm.write keeps a progress bar intact). Register it after `growth`: callbacks run in registration
    order."""

    def __init__(self, growth: IncrtGrowthCallback | None, step_offset: int = 0):
        self.growth = growth
        self.step_offset = step_offset
        self.printed = 0

    def _print_new(self) -> None:
        events = self.growth.history["events"] if self.growth is not None and self.growth.history else []
        for event in events[self.printed:]:
            tqdm.write("INCRT " + describe_event({**event, "step": event["step"] + self.step_offset}))
        self.printed = len(events)

    def on_train_begin(self, args, state, control, **kwargs):
        self._print_new()

    def on_step_end(self, args, state, control, **kwargs):
        self._print_new()

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if metrics and "eval_accuracy" in metrics:
            tqdm.write(f"step {state.global_step + self.step_offset}: validation accuracy "
                       f"{metrics['eval_accuracy']:.4f}")


class ProgressBarOnly(ProgressCallback):
    """The Trainer's progress bar without its raw log records (`GrowthEventPrinter` prints what matters)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        return


@torch.no_grad()
def gate_spectrum(model: DDCLIncrtPreTrainedModel, batch: dict, deflated: bool = True) -> list[list[float]]:
    """Exact eigenvalues (float64 `eigvalsh`), in decreasing order, of every layer's A_res = P sym(C M_a) P
    (`deflated=False`: A_sym = sym(C M_a)) on `batch`: the reference for the gate's tracked lambda_max."""
    moments = model.gate_second_moments(**batch)
    spectra = []
    for layer, moment in zip(model.base_model.layers, moments, strict=True):
        attention = layer.attention
        directional = directional_matrix(attention.stacked("q_proj").detach().double(),
                                         attention.stacked("k_proj").detach().double())
        matrix = interaction_matrix(moment.double(), directional)
        if deflated:
            matrix = deflate(matrix, attention.gate.active_basis().double())
        spectra.append(torch.linalg.eigvalsh(matrix).flip(0).tolist())
    return spectra


@torch.no_grad()
def head_energies(model: DDCLIncrtPreTrainedModel, inputs: dict) -> list[list[float]]:
    """Per layer and head, the INCRT prune criterion ||C M_a^h||_F (DESIGN §3) on the tokens of `inputs`
    (on the model's device)."""
    moments = model.gate_second_moments(input_ids=inputs["input_ids"],
                                        attention_mask=inputs.get("attention_mask"))
    return [head_directional_energy(moment, layer.attention.stacked("q_proj").float(),
                                    layer.attention.stacked("k_proj").float()).tolist()
            for layer, moment in zip(model.base_model.layers, moments, strict=True)]


class PrototypeProbe(TrainerCallback):
    """Every `every` steps (and at the start of each run), the model in eval mode on a batch: accuracy, L_q,
    L_OLS, V and, per layer and head, tau, min pairwise prototype distance, effective number of used
    prototypes and the INCRT directional energy ||C M_a^h||_F. `batch`: model inputs with `labels`, or a
    function of the global step returning them (e.g. held-out rows of a stream at that step);
    `step_offset` turns a run's steps into global ones."""

    def __init__(self, batch: dict | Callable[[int], dict], every: int):
        self.batch = batch
        self.every = every
        self.step_offset = 0
        self.records: list[dict] = []

    @torch.no_grad()
    def record(self, model: DDCLIncrtPreTrainedModel, step: int) -> dict:
        was_training = model.training
        model.eval()
        batch = self.batch(step) if callable(self.batch) else self.batch
        try:
            inputs = {name: value.to(model.device) for name, value in batch.items()}
            outputs = model(**inputs, output_prototype_statistics=True)
            energies = head_energies(model, inputs)
        finally:
            model.train(was_training)
        accuracy = (outputs.logits.argmax(-1) == inputs["labels"]).float().mean()
        record = {
            "step": step, "num_heads": list(model.config.num_heads), "accuracy": float(accuracy),
            "loss": float(outputs.loss), "l_q": float(outputs.l_q), "l_ols": float(outputs.l_ols),
            "prototype_variance": float(outputs.prototype_variance),
            "temperatures": [t.tolist() for t in outputs.temperatures],
            "min_prototype_distance": [d.tolist() for d in outputs.min_prototype_distance],
            "prototype_perplexity": [p.tolist() for p in outputs.prototype_perplexity],
            "head_energy": energies,
        }
        self.records.append(record)
        return record

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        step = state.global_step + self.step_offset
        if not self.records or self.records[-1]["step"] != step:
            self.record(model, step)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if (state.global_step + self.step_offset) % self.every == 0:
            self.record(model, state.global_step + self.step_offset)


def rows_as_batch(dataset: Dataset, rows: range | list[int]) -> dict:
    """Model inputs and labels of equal-length rows as tensors (the synthetic tasks have no padding)."""
    selected = dataset.select(rows)
    return {name: torch.tensor(selected[name]) for name in ("input_ids", "attention_mask", "labels")}


@torch.no_grad()
def evaluate_accuracy(model: DDCLIncrtPreTrainedModel, dataset: Dataset, batch_size: int = 256) -> float:
    """Accuracy of the model (eval mode) on every row of an equal-length synthetic dataset."""
    was_training = model.training
    model.eval()
    correct = 0
    try:
        for start in range(0, len(dataset), batch_size):
            batch = rows_as_batch(dataset, range(start, min(start + batch_size, len(dataset))))
            labels = batch.pop("labels")
            correct += int((model(**batch).logits.argmax(-1) == labels).sum())
    finally:
        model.train(was_training)
    return correct / len(dataset)


# ---------------------------------------------------------------------------------------------------------
# The growth recipe
# ---------------------------------------------------------------------------------------------------------


@dataclass
class GrowthRun:
    """What `run_growth_training` returns; `history` has global steps and `growth_started_at_step`."""

    model: DDCLIncrtForSequenceClassification
    history: dict
    log_history: list[dict] = field(default_factory=list)
    evaluations: list[dict] = field(default_factory=list)
    train_time_s: float = 0.0


def training_arguments(args: argparse.Namespace, output_dir: str | os.PathLike, *, max_steps: int,
                       scheduler: str, warmup_steps: int, data_seed: int, sequential: bool,
                       evaluate: bool) -> TrainingArguments:
    """TrainingArguments of one phase: CPU, no checkpoints, no reporting; optional evaluations."""
    return TrainingArguments(
        output_dir=str(output_dir), max_steps=max_steps, per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=max(256, args.batch_size), learning_rate=args.learning_rate,
        weight_decay=args.weight_decay, lr_scheduler_type=scheduler, warmup_steps=warmup_steps,
        logging_steps=min(args.eval_steps, max_steps), eval_strategy="steps" if evaluate else "no",
        eval_steps=args.eval_steps if evaluate else None, save_strategy="no", report_to="none",
        disable_tqdm=not args.progress, seed=args.seed, data_seed=data_seed, use_cpu=True,
        train_sampling_strategy="sequential" if sequential else "random", dataloader_num_workers=0,
    )


def _offset_history(history: dict, offset: int) -> dict:
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
) -> GrowthRun:
    """The growth recipe of the module docstring on the stock `Trainer`; writes growth_history.json and its
    plot (global steps) into `output_dir`.

    `sequential`: `train_dataset` is a stream of `args.batch_size` rows per step (global step t trains on
    rows [t * batch_size, (t + 1) * batch_size)). `window_steps`: run the growth phase as windows of that
    many steps; `on_window(start, end)` is called before each (e.g. to move the probe's batch).
    `gate_window_steps` (with `sequential`, not with `window_steps`): one growth phase whose gate checks read
    the rows of the last that many steps.
    """
    continuous = gate_window_steps is not None
    if continuous and (window_steps is not None or not sequential or gate_window_steps < 1):
        raise ValueError("`gate_window_steps` must be >= 1 and needs `sequential=True` and no "
                         f"`window_steps`, got gate_window_steps={gate_window_steps}, "
                         f"window_steps={window_steps}, sequential={sequential}")
    output_dir = Path(output_dir)
    optimizer = None  # one for all phases, built from the first phase's arguments
    compute_metrics = classification_metrics() if eval_dataset is not None else None
    growth_steps = args.max_steps - args.pre_growth_steps
    window = window_steps or growth_steps
    phases = [(0, args.pre_growth_steps)] if args.pre_growth_steps else []
    phases += [(start, min(start + window, args.max_steps))
               for start in range(args.pre_growth_steps, args.max_steps, window)]
    run = GrowthRun(model=model, history={})
    merged, window_stops = None, []
    started = time.perf_counter()
    for index, (start, end) in enumerate(phases):
        growing = start >= args.pre_growth_steps
        if on_window is not None:
            on_window(start, end)
        rows = train_dataset
        if sequential:
            rows = train_dataset.select(range(start * args.batch_size, end * args.batch_size))
        last = index == len(phases) - 1
        scheduler = args.lr_scheduler_type if growing and window_steps is None else "constant_with_warmup"
        phase_args = training_arguments(
            args, output_dir, max_steps=end - start, scheduler=scheduler,
            warmup_steps=args.warmup_steps if index == 0 else 0, data_seed=args.seed + index,
            sequential=sequential, evaluate=eval_dataset is not None and last,
        )
        if optimizer is None:
            optimizer = make_optimizer(model, phase_args,
                                       prototype_lr_multiplier=args.prototype_lr_multiplier)
        callbacks: list[TrainerCallback] = []
        growth = None
        if growing:
            gate_rows = None
            if continuous:
                gate_rows = partial(recent_stream_rows, gate_window_steps, args.batch_size)
            growth = IncrtGrowthCallback(check_every=args.check_every, gate_batch_size=args.gate_batch_size,
                                         save_plot=False, regrow=continuous, gate_rows=gate_rows)
            callbacks.append(growth)
        if print_events:
            callbacks.append(GrowthEventPrinter(growth, step_offset=start))
        if probe is not None:
            probe.step_offset = start
            callbacks.append(probe)
        trainer = Trainer(model=model, args=phase_args, train_dataset=rows,
                          eval_dataset=eval_dataset if phase_args.eval_strategy != "no" else None,
                          compute_metrics=compute_metrics, optimizers=(optimizer, None), callbacks=callbacks)
        trainer.remove_callback(PrinterCallback)
        if args.progress:
            trainer.remove_callback(ProgressCallback)
            trainer.add_callback(ProgressBarOnly())
        trainer.train()
        for entry in trainer.state.log_history:
            run.log_history.append({**entry, "step": entry["step"] + start} if "step" in entry else entry)
        if growth is not None:
            window_history = _offset_history(growth.history, start)
            window_stops.append(window_history["growth_stopped_at_step"])
            merged = _merge_window_history(merged, window_history)
    run.train_time_s = time.perf_counter() - started
    merged["growth_started_at_step"] = args.pre_growth_steps
    if window_steps is not None:
        merged.update(window_steps=window_steps, window_stops=window_stops)
    run.history = merged
    run.evaluations = [{"step": entry["step"], "accuracy": entry["eval_accuracy"]}
                       for entry in run.log_history if "eval_accuracy" in entry]
    output_dir.mkdir(parents=True, exist_ok=True)
    write_json(output_dir / HISTORY_FILE, merged)
    plot_growth_history(merged, output_dir / PLOT_FILE)
    return run


# ---------------------------------------------------------------------------------------------------------
# Analysis: the head-count law, grow order, temperatures
# ---------------------------------------------------------------------------------------------------------


def head_count_law(history: dict) -> list[dict]:
    """INCRT head-count law K* = kappa_T^2 log(Gamma_res^(0) / theta_w) per layer from the gate's trajectory,
    against the observed heads (`spectrum_head_count_law` is the estimator on one exact spectrum).

    The Theta() constant is taken as 1; the papers do not say how to estimate kappa_T, so from the run:

    * Gamma_res^(0): lambda_max(A_res) at the layer's first gate check in `history["checks"]` (after
      calibration); theta_w: its threshold;
    * lambda_1, ..., lambda_n: lambda_max(A_res) at the layer's n grow events; lambda_end: at its first stop
      or full verdict (its last check if there is none);
    * per-head contraction rho = (lambda_end / lambda_1)^(1/n), kappa_T^2 = 1 / (1 - rho): a residual
      shrinking by the factor (1 - 1/kappa_T^2) per head reaches theta_w after about
      kappa_T^2 log(Gamma_res^(0) / theta_w) heads (`predicted_heads`, `ratio` = predicted / observed).

    The lambdas are measured at different steps, while W_Q, W_K learn, so they only approximate one spectrum.
    Fields are None where undefined: no check, no head grown, Gamma_res^(0) <= theta_w, or rho >= 1.
    """
    layers = []
    for layer, observed in enumerate(history["num_heads"]):
        checks = [check for check in history["checks"] if check["action"][layer] != "calibrating"]
        events = [event for event in history["events"] if event["layer"] == layer]
        grown = [event["lambda_max"] for event in events if event["action"] == "grow"]
        stops = [event["lambda_max"] for event in events if event["action"] in ("stop", "full")]
        record = {"layer": layer, "observed_heads": observed,
                  "initial_heads": history["initial_num_heads"][layer], "grow_lambdas": grown,
                  "gamma_res0": None, "theta_w": None, "lambda_end": None, "rho": None, "kappa_T": None,
                  "predicted_heads": None, "ratio": None}
        layers.append(record)
        if not checks:
            continue
        gamma, theta = checks[0]["lambda_max"][layer], checks[0]["theta_w"][layer]
        end = stops[0] if stops else checks[-1]["lambda_max"][layer]
        record.update(gamma_res0=gamma, theta_w=theta, lambda_end=end)
        if not (grown and gamma > theta > 0 and grown[0] > 0):
            continue
        record["rho"] = (max(end, 0.0) / grown[0]) ** (1 / len(grown))
        if record["rho"] < 1:
            record["kappa_T"] = math.sqrt(1 / (1 - record["rho"]))
            record["predicted_heads"] = record["kappa_T"] ** 2 * math.log(gamma / theta)
            record["ratio"] = record["predicted_heads"] / observed
    return layers


def theta_at_growth_start(history: dict, model: DDCLIncrtPreTrainedModel) -> list[float]:
    """theta_w per layer at the first growth check: the calibrated value, or the "relative" threshold on the
    spectrum growth started from (the gates' current theta_w when no check ran)."""
    if history["checks"]:
        return list(history["checks"][0]["theta_w"])
    return [float(layer.attention.gate.theta_w) for layer in model.base_model.layers]


def spectrum_head_count_law(spectra: list[list[float]], theta_w: list[float],
                            observed_heads: list[int]) -> list[dict]:
    """INCRT head-count law on one exact spectrum per layer (e.g. `gate_spectrum` when growth starts): the
    captured spectrum is the eigenvalues above theta_w, lambda_1 >= ... >= lambda_m (m = the heads a gate
    acting on this one spectrum would grow), Gamma_res^(0) = lambda_1, kappa_T = lambda_1 / lambda_m (the
    condition number of the captured spectrum) and K* = kappa_T^2 log(lambda_1 / theta_w); K* = 0 when
    m = 0. `ratio` = K* / observed heads."""
    for name, values in (("theta_w", theta_w), ("observed_heads", observed_heads)):
        if len(values) != len(spectra):
            raise ValueError(f"`{name}` needs one entry per layer ({len(spectra)}), got {len(values)}")
    layers = []
    rows = zip(spectra, theta_w, observed_heads, strict=True)
    for layer, (eigenvalues, theta, observed) in enumerate(rows):
        captured = [value for value in eigenvalues if value > theta]
        record = {"layer": layer, "observed_heads": observed, "theta_w": theta,
                  "captured_eigenvalues": captured, "gamma_res0": captured[0] if captured else None,
                  "kappa_T": None, "predicted_heads": 0.0, "ratio": 0.0}
        if captured and theta > 0:
            record["kappa_T"] = captured[0] / captured[-1]
            record["predicted_heads"] = record["kappa_T"] ** 2 * math.log(captured[0] / theta)
            record["ratio"] = record["predicted_heads"] / observed
        layers.append(record)
    return layers


def grow_order(history: dict) -> list[dict]:
    """Per layer: lambda_max at successive grow events and whether they decrease (INCRT: heads are added in
    decreasing eigenvalue order); `decreasing_pairs` counts consecutive pairs with lambda_{i+1} < lambda_i."""
    layers = []
    for layer in range(len(history["num_heads"])):
        lambdas = [event["lambda_max"] for event in history["events"]
                   if event["layer"] == layer and event["action"] == "grow"]
        pairs = list(zip(lambdas, lambdas[1:], strict=False))
        layers.append({"layer": layer, "grow_lambdas": lambdas, "pairs": len(pairs),
                       "decreasing_pairs": sum(later < earlier for earlier, later in pairs),
                       "decreasing": all(later < earlier for earlier, later in pairs)})
    return layers


def stop_summary(history: dict) -> list[dict]:
    """Per layer: how growth ended: "stop" (lambda_max <= theta_w: a finite stop), "full" (max_heads) or
    None (still growing at the end), with the step."""
    layers = []
    for layer in range(len(history["num_heads"])):
        ends = [e for e in history["events"] if e["layer"] == layer and e["action"] in ("stop", "full")]
        layers.append({"layer": layer, "verdict": ends[0]["action"] if ends else None,
                       "step": ends[0]["step"] if ends else None,
                       "lambda_max": ends[0]["lambda_max"] if ends else None,
                       "theta_w": ends[0]["theta_w"] if ends else None})
    return layers


def temperature_split(temperatures: list[list[float]], tau_min: float, tau_init: float) -> list[dict]:
    """Per layer: heads are "local" when tau moved more than halfway from tau_init to tau_min
    (tau - tau_min < (tau_init - tau_min) / 2: sharp, near-hard assignment), "global" otherwise
    (DESIGN §3)."""
    midpoint = tau_min + (tau_init - tau_min) / 2
    return [{"layer": layer, "temperatures": taus,
             "local_heads": [h for h, tau in enumerate(taus) if tau < midpoint],
             "global_heads": [h for h, tau in enumerate(taus) if tau >= midpoint], "threshold": midpoint}
            for layer, taus in enumerate(temperatures)]


# ---------------------------------------------------------------------------------------------------------
# Result files and tables
# ---------------------------------------------------------------------------------------------------------


def write_json(path: str | os.PathLike, content: dict) -> None:
    """Indented JSON; NaN/inf are written as null (strict JSON)."""
    def finite(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {key: finite(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(item) for item in value]
        if isinstance(value, np.generic):
            return finite(value.item())
        return value

    Path(path).write_text(json.dumps(finite(content), indent=2) + "\n", encoding="utf-8")


def environment() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "threads": torch.get_num_threads(),
            "machine": platform.machine(), "cpus": os.cpu_count()}


def command_line(script: str, argv: list[str] | None) -> str:
    """The command that reproduces a run, as shown next to its table."""
    arguments = sys.argv[1:] if argv is None else argv
    return " ".join(["python", f"scripts/{script}", *arguments])


def markdown_table(headers: list[str], rows: list[list]) -> str:
    """A GitHub markdown table; floats with 4 significant digits."""
    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return "-" if value is None else str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def events_table(history: dict) -> str:
    """Growth events (calibration, grow, stop, full, prune) with lambda_max, theta_w and heads after."""
    rows = [[e["step"], e["layer"], e["action"], e.get("lambda_max", e.get("energy")), e["theta_w"],
             e["num_heads"]] for e in history["events"]]
    return markdown_table(["step", "layer", "event", "lambda_max (prune: energy)", "theta_w", "heads after"],
                          rows)


def parameter_count(model: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


__all__ = [
    "GrowthEventPrinter", "GrowthRun", "ProgressBarOnly", "PrototypeProbe", "add_experiment_arguments",
    "build_model", "check_experiment_arguments", "command_line", "describe_event", "environment",
    "evaluate_accuracy", "events_table", "gate_choices", "gate_spectrum", "grow_order", "head_count_law",
    "markdown_table", "parameter_count", "recent_stream_rows", "rows_as_batch", "run_growth_training",
    "spectrum_head_count_law", "stop_summary", "temperature_split", "training_arguments", "write_json",
]
