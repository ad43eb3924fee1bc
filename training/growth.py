"""INCRT head growth inside `transformers.Trainer` (docs/ddcl_incrt.md, 'Growth and pruning'): gate checks,
growth, pruning, optimizer upkeep, several processes, growth history, and checkpoints that are complete or
refused.

`IncrtGrowthCallback` drives a `DDCLIncrtPreTrainedModel` through the model's growth API:

* nothing happens before optimizer step `start_step` (default 0): the heads first train with no gate, so
  warm-up and growth are one `Trainer` run (docs/experiments.md, 'Shared recipe');
* under `gate_threshold="calibrated"`, theta_w is calibrated at `start_step` (at the start of training for
  0) on the first `gate_calibration_checks` gate batches (INCRT: gate_calibration_factor x median
  ||A_res||_F), unless the config fixes it or the gates are already calibrated (a resumed or pre-trained
  model); those checks only calibrate, nothing grows at that step (the default "relative" threshold needs
  no calibration; docs/growth_gate.md);
* every `check_every` optimizer steps after `start_step`, in `on_step_end` (after the optimizer and
  scheduler steps, gradients zeroed), each layer's gate checks C = X^T X / N of a gate batch: heads the
  gate lists are pruned, and a layer still growing gets a head along u+ when lambda_max(A_res) > theta_w.
  A layer stops growing for good
  at its first "stop" (lambda_max <= theta_w) or "full" (max_heads reached) verdict; growth has stopped when
  no layer grows any more (`growth_stopped_at_step`). Checks go on while pruning is enabled. With
  `regrow=True` no verdict is final: every check may grow a layer again (data whose structure changes over
  time; use it with the "relative" `gate_threshold`, which follows the scale of the weights), a stop/full
  event is recorded when a layer's verdict changes to it, and `growth_stopped_at_step` stays None;
* under `gate_rule="need"` (docs/growth_gate.md, 'The need rule') one forward of `NEED_MONITOR_ROWS`
  labelled rows fixed for the whole run (`_monitor_batch`) gives each check's task loss and C, whose loss at
  `start_step` is the first check's plateau reference; where a layer's loss has settled the newest head's
  removal is measured on the same rows, and only where a verdict reads the held-out probes is a labelled
  gate batch drawn for them (`need_evidence`); grown heads keep their initialisation (not
  function-preserving) but start from the prototype bank of the layer's first head;
* after every change the optimizer is re-synchronised (`sync_optimizer_with_model`);
* gate batches are `gate_batch_size` rows of the Trainer's training set, collated by its data collator,
  drawn from a generator seeded by (args.seed, gate check count, process rank): resumed runs draw the same.
  `gate_rows(global_step)` may restrict the draw to some rows, e.g. those of the last steps of a time-ordered
  stream, so that with `regrow=True` one callback follows a stream whose structure changes (it is a
  callable, so it is not part of the saved callback state: pass it again when resuming).

Several processes (DDP): C is averaged over the ranks before `gate_check`, so every rank takes the same
decision; a new head's parameters are broadcast from rank 0; DDP fixed its parameter set when it wrapped the
model, so each parameter created afterwards gets a post-accumulate-grad hook that averages its gradient over
the ranks at every backward (before clipping, so every rank clips alike). Pruned heads stay registered with
DDP and get no gradient: that needs `ddp_find_unused_parameters` True (the Trainer's default for these
models), and the callback refuses to start otherwise while pruning is enabled (`gate_prune_factor` > 0).

Records: `growth_history.json` (checks, events, head counts) in the output directory and in every checkpoint,
per-layer head counts, lambda_max and theta_w (`incrt/*`) merged into the Trainer's log records
(`state.log_history`, the printed logs, and the `report_to` integrations once the Trainer went through
`report_callback_metrics`, `reporting.py`), `growth_history.png` at the end. A checkpoint is complete once
`on_save` wrote `geoformers_checkpoint.json` (head counts, size and modification time of every file;
`CompleteCheckpointsCallback` in `checkpoints.py`, which this callback extends); `latest_complete_checkpoint`
and `resume_growth_training` use only complete ones, and so does the stock
`trainer.train(resume_from_checkpoint=True)`: when the Trainer is built, checkpoints newer than the newest
complete one are renamed `.incomplete-checkpoint-<step>`. The stock resume continues a grown run from a
model at its initial size: the callback makes the model take the head counts of the weights the Trainer
loads (`follow_saved_head_counts`, `resume.py`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from transformers import TrainingArguments
from transformers.trainer_callback import ExportableState, TrainerControl, TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import logging

from geoformers.models.ddcl_incrt.incrt import DEFAULT_GATE_TOKENS, DEFAULT_TRACKER_STEPS, NeedEvidence
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtPreTrainedModel
from geoformers.models.ddcl_incrt.need_test import need_evidence, task_scores
from geoformers.training.checkpoints import CompleteCheckpointsCallback, write_json_atomically
from geoformers.training.optim import sync_optimizer_with_model
from geoformers.training.reporting import warn_if_unreported
from geoformers.training.resume import follow_saved_head_counts

# A child of transformers' library logger, so `transformers.logging.set_verbosity_info()` and
# `TrainingArguments(log_level="info")` show the growth events (a "geoformers.*" logger ignores both).
logger = logging.get_logger(f"transformers.{__name__}")

HISTORY_FILE = "growth_history.json"
PLOT_FILE = "growth_history.png"
GATE_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "inputs_embeds")
NEED_MONITOR_ROWS = 128  # rows of the need rule's plateau monitor (`_monitor_batch`) ...
NEED_MONITOR_TOKENS = 16384  # ... at most: the first rows within this many tokens (long rows: fewer of them)
# The callback's cadence (docs/growth_gate.md, 'Cadence'): defaults, and the config fields that held it.
CADENCE_DEFAULTS = {
    "check_every": 100,
    "gate_num_tokens": DEFAULT_GATE_TOKENS,
    "tracker_steps": DEFAULT_TRACKER_STEPS,
}
FORMER_CADENCE_FIELDS = {
    "check_every": "gate_check_every",
    "gate_num_tokens": "gate_num_tokens",
    "tracker_steps": "gate_tracker_steps",
}


class IncrtGrowthCallback(CompleteCheckpointsCallback, ExportableState):
    """Grow and prune DDCL-INCRT heads while `Trainer.train()` runs (INCRT gate; module docstring).

    The cadence (`check_every`, `gate_batch_size`, `gate_num_tokens`, `tracker_steps`) is the callback's; the
    rule and its parameters are the model config's (docs/growth_gate.md, 'Cadence').

    Args:
        check_every (`int`, *optional*): optimizer steps between gate checks; default 100.
        gate_batch_size (`int`, *optional*): training rows per gate check and process; default
            `args.per_device_train_batch_size`.
        gate_num_tokens (`int`, *optional*): tokens per gate check (at least 2), evenly spaced over the gate
            batch's real tokens; default 512.
        tracker_steps (`int`, *optional*): most tracker iterations per check and layer; default 200.
        save_plot (`bool`): save `growth_history.png` (heads and lambda_max against steps) at the end.
        regrow (`bool`): a "stop" or "full" verdict does not end a layer's growth (module docstring).
        gate_rows (`Callable[[int], Sequence[int]]`, *optional*): the training-set rows a gate check at
            `state.global_step` may draw from (default: all); at most `gate_batch_size` of them are used.
        start_step (`int`): the optimizer step at which growth starts: calibration then, the first gate check
            `check_every` steps later; none before.

    A config.json written while the config held the cadence may carry `gate_check_every`,
    `gate_num_tokens` or `gate_tracker_steps`: an argument left None takes that value (`cadence`).
    """

    def __init__(
        self,
        check_every: int | None = None,
        gate_batch_size: int | None = None,
        save_plot: bool = True,
        regrow: bool = False,
        gate_rows: Callable[[int], Sequence[int]] | None = None,
        start_step: int = 0,
        gate_num_tokens: int | None = None,
        tracker_steps: int | None = None,
    ):
        for name, value in (
            ("check_every", check_every),
            ("gate_batch_size", gate_batch_size),
            ("tracker_steps", tracker_steps),
        ):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"`{name}` must be None or an int >= 1, got {value!r}")
        if gate_num_tokens is not None and (
            isinstance(gate_num_tokens, bool) or not isinstance(gate_num_tokens, int) or gate_num_tokens < 2
        ):
            raise ValueError(f"`gate_num_tokens` must be None or an int >= 2, got {gate_num_tokens!r}")
        if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"`start_step` must be an int >= 0, got {start_step!r}")
        for name, value in (("save_plot", save_plot), ("regrow", regrow)):
            if not isinstance(value, bool):
                raise TypeError(f"`{name}` must be a bool, got {value!r}")
        if gate_rows is not None and not callable(gate_rows):
            raise TypeError(f"`gate_rows` must be None or a callable step -> row indices, got {gate_rows!r}")
        self.check_every = check_every
        self.gate_batch_size = gate_batch_size
        self.gate_num_tokens = gate_num_tokens
        self.tracker_steps = tracker_steps
        self.gate_rows = gate_rows
        self.save_plot = save_plot
        self.regrow = regrow
        self.start_step = start_step
        self.history: dict | None = None
        self._group = None  # process group of the gate's collectives; None in a single process
        self._need = None  # the last check's need tests (`gate_rule="need"`)
        self._monitor = None  # the need rule's fixed monitor rows, collated
        self._gradient_hooks: dict[int, torch.utils.hooks.RemovableHandle] = {}

    def state(self) -> dict:
        """ExportableState: saved in trainer_state.json, so a resumed run continues the history."""
        return {
            "args": {
                "check_every": self.check_every,
                "gate_batch_size": self.gate_batch_size,
                "save_plot": self.save_plot,
                "regrow": self.regrow,
                "start_step": self.start_step,
                "gate_num_tokens": self.gate_num_tokens,
                "tracker_steps": self.tracker_steps,
            },
            "attributes": {"history": self.history},
        }

    def cadence(self, config) -> dict[str, int]:
        """`check_every`, `gate_num_tokens` and `tracker_steps` for a model of `config`: each argument, else
        the former config field a config.json written before may carry (`FORMER_CADENCE_FIELDS`), else the
        default (`CADENCE_DEFAULTS`)."""
        cadence = {}
        for name, default in CADENCE_DEFAULTS.items():
            value = getattr(self, name)
            if value is None:
                value = getattr(config, FORMER_CADENCE_FIELDS[name], default)
                low = 2 if name == "gate_num_tokens" else 1
                if isinstance(value, bool) or not isinstance(value, int) or value < low:
                    raise ValueError(
                        f"the config's former field `{FORMER_CADENCE_FIELDS[name]}` must be an int >= {low}, "
                        f"got {value!r}: pass `{name}` to IncrtGrowthCallback"
                    )
            cadence[name] = value
        return cadence

    # ----------------------------------------------------------------------------------------- events

    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        """Prepare for a stock resume: incomplete checkpoints out of its way (`CompleteCheckpointsCallback`),
        the Trainer's model and optimizer following the loaded head counts (`follow_saved_head_counts`)."""
        super().on_init_end(args, state, control, **kwargs)
        model = kwargs.get("model")
        if isinstance(model, DDCLIncrtPreTrainedModel):
            follow_saved_head_counts(model, kwargs.get("optimizer"))

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        model = kwargs["model"]
        if not isinstance(model, DDCLIncrtPreTrainedModel):
            raise TypeError(f"IncrtGrowthCallback needs a DDCL-INCRT model, got {type(model).__name__}")
        dataloader = kwargs["train_dataloader"]
        dataset = dataloader.dataset
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")) or len(dataset) == 0:
            raise ValueError(
                "IncrtGrowthCallback draws gate batches from the training set: `train_dataset` "
                "must be a non-empty map-style dataset (indexable, with a length)"
            )
        warn_if_unreported(self, args, state, "INCRT gate statistics (incrt/*)")
        self._dataset, self._collate = dataset, dataloader.collate_fn
        self._rows = self.gate_batch_size or args.per_device_train_batch_size
        self._cadence = self.cadence(model.config)
        self._setup_processes(args, model)
        self._start_or_restore_history(state, model)
        if state.global_step >= self.start_step:
            self._calibrate(args, model, state.global_step)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        model = kwargs["model"]
        history = self.history
        step = state.global_step
        if step == self.start_step:
            self._calibrate(args, model, step)
        pruning = model.config.gate_prune_factor > 0
        since_start = step - self.start_step
        every = self._cadence["check_every"]
        if since_start <= 0 or since_start % every != 0 or not (any(history["growing"]) or pruning):
            return
        started = time.perf_counter()
        decisions = self._decisions(args, model, step)
        events, added, pruned = [], [], False
        for decision in decisions:
            layer = decision.layer
            for head in decision.prune:
                self._forget_hooks(model.prune_head(layer, head))
                pruned = True
                events.append(
                    {
                        "step": step,
                        "layer": layer,
                        "action": "prune",
                        "head": head,
                        "energy": decision.head_energies[head],
                        "theta_w": decision.theta_w,
                        "num_heads": list(model.config.num_heads),
                    }
                )
            if not history["growing"][layer] or decision.action not in ("grow", "stop", "full"):
                continue
            previous = history["verdicts"][layer]
            history["verdicts"][layer] = decision.action
            if self.regrow and decision.action == previous != "grow":
                continue  # the same stop/full verdict again: nothing to record
            event = {
                "step": step,
                "layer": layer,
                "action": decision.action,
                "lambda_max": decision.lambda_max,
                "theta_w": decision.theta_w,
            }
            if decision.action == "grow":
                head = model.grow_head(
                    layer,
                    decision.direction,
                    function_preserving=decision.function_preserving,
                    prototypes_from=decision.prototypes_from,
                )
                added.append(head)
                event["head"] = model.config.num_heads[layer] - 1
            elif not self.regrow:
                history["growing"][layer] = False
            events.append({**event, "num_heads": list(model.config.num_heads)})
        if added:
            self._share_new_heads(added)
        if added or pruned:
            sync_optimizer_with_model(kwargs["optimizer"], model)
        history["num_heads"] = list(model.config.num_heads)
        check = {
            "step": step,
            "num_heads": list(model.config.num_heads),
            "lambda_max": [d.lambda_max for d in decisions],
            "lambda_min": [d.lambda_min for d in decisions],
            "theta_w": [d.theta_w for d in decisions],
            "action": [d.action for d in decisions],
        }
        if self._need is not None:
            check["need"] = [evidence._asdict() for evidence in self._need]
        history["checks"].append(check)
        history["gate_seconds"] = history.get("gate_seconds", 0.0) + time.perf_counter() - started
        history["events"].extend(events)
        if history["growth_stopped_at_step"] is None and not any(history["growing"]):
            history["growth_stopped_at_step"] = step
            logger.info(f"INCRT growth stopped at step {step} with heads {model.config.num_heads}")
        for event in events:
            measure = "energy" if event["action"] == "prune" else "lambda_max"
            logger.info(
                f"INCRT {event['action']} at step {step}: layer {event['layer']}, {measure} "
                f"{event[measure]:.4g}, theta_w {event['theta_w']:.4g} -> heads {event['num_heads']}"
            )
        if events:
            control.should_log = True
            if state.is_world_process_zero:
                write_json_atomically(Path(args.output_dir) / HISTORY_FILE, history)

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, logs=None, **kwargs
    ):
        """Merge the latest check (per-layer heads, lambda_max, theta_w) into the Trainer's log record."""
        if self.history is None or not self.history["checks"] or logs is None:
            return
        check = self.history["checks"][-1]
        metrics = {}
        for layer, heads in enumerate(check["num_heads"]):
            metrics[f"incrt/num_heads_layer{layer}"] = heads
            metrics[f"incrt/lambda_max_layer{layer}"] = check["lambda_max"][layer]
            metrics[f"incrt/theta_w_layer{layer}"] = check["theta_w"][layer]
        logs.update(metrics)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(metrics)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        """The Trainer has written checkpoint-N completely: add the history, then the completion marker with
        the head counts (`CompleteCheckpointsCallback.on_save`)."""
        checkpoint = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if args.should_save and checkpoint.is_dir():
            write_json_atomically(checkpoint / HISTORY_FILE, self.history)
            write_json_atomically(Path(args.output_dir) / HISTORY_FILE, self.history)
        super().on_save(args, state, control, **kwargs)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        for handle in self._gradient_hooks.values():
            handle.remove()
        self._gradient_hooks.clear()
        if not state.is_world_process_zero:
            return
        super().on_train_end(args, state, control, **kwargs)
        output_dir = Path(args.output_dir)
        write_json_atomically(output_dir / HISTORY_FILE, self.history)
        if self.save_plot:
            plot_growth_history(
                self.history,
                output_dir / PLOT_FILE,
                log_history=state.log_history,
                last_step=state.global_step,
            )

    # ----------------------------------------------------------------------------------------- helpers

    def _start_or_restore_history(self, state: TrainerState, model: DDCLIncrtPreTrainedModel) -> None:
        """Fresh runs start a history; resumed runs continue the one saved in trainer_state.json (unless the
        Trainer already restored this callback) and must have the checkpoint's head counts."""
        num_heads = list(model.config.num_heads)
        if state.global_step == 0:
            self.history = {
                "initial_num_heads": num_heads,
                "num_heads": num_heads,
                "growing": [True] * len(num_heads),
                "verdicts": [None] * len(num_heads),
                "growth_started_at_step": self.start_step,
                "growth_stopped_at_step": None,
                "checks": [],
                "events": [],
            }
            return
        if self.history is None:
            saved = (state.stateful_callbacks or {}).get(type(self).__name__, {})
            self.history = saved.get("attributes", {}).get("history") if isinstance(saved, dict) else None
        if self.history is None:
            raise ValueError(
                "resuming a run whose checkpoint has no IncrtGrowthCallback history: train it "
                "with the callback from the start"
            )
        if self.history["num_heads"] != num_heads:
            raise ValueError(
                f"the model has heads {num_heads} but the checkpoint was saved with "
                f"{self.history['num_heads']}: resume with `resume_growth_training(trainer, checkpoint)` or "
                "load the model from the checkpoint"
            )

    def _setup_processes(self, args: TrainingArguments, model: DDCLIncrtPreTrainedModel) -> None:
        """Under several processes: a process group for the gate's collectives, and the DDP settings check."""
        if args.deepspeed or args.fsdp or _sharded_by_fsdp(model):
            raise ValueError(
                "IncrtGrowthCallback cannot grow a model sharded by FSDP (FSDP1 or FSDP2 "
                "`fully_shard`) or DeepSpeed: growth changes parameter shapes the shards fixed. "
                "To grow on several processes use DDP (the Trainer's default under torchrun "
                "without `fsdp`/`deepspeed`)"
            )
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            self._group = None
            return
        if args.ddp_static_graph:
            raise ValueError("`ddp_static_graph` assumes a fixed set of used parameters; growth changes it")
        finds_unused = args.ddp_find_unused_parameters
        if finds_unused is None:
            finds_unused = not (model.is_activation_checkpointing or args.activation_checkpointing)
        if model.config.gate_prune_factor > 0 and not finds_unused:
            raise ValueError(
                "pruning (`gate_prune_factor` > 0) under DDP needs "
                "`ddp_find_unused_parameters=True`: pruned heads stay registered with DDP and "
                "get no gradient"
            )
        self._group = dist.new_group()

    def _gate_batch(self, args: TrainingArguments, model: DDCLIncrtPreTrainedModel, step: int) -> dict:
        """`gate_batch_size` training rows (of `gate_rows(step)` if given), collated; seeded by (args.seed,
        checks so far, rank)."""
        checks_so_far = int(model.base_model.layers[0].attention.gate.num_checks)
        rank = dist.get_rank() if self._group is not None else 0
        generator = np.random.default_rng([args.seed, checks_so_far, rank])
        candidates = np.arange(len(self._dataset))
        if self.gate_rows is not None:
            candidates = np.asarray(list(self.gate_rows(step)), dtype=np.int64)
            if candidates.ndim != 1 or candidates.size == 0:
                raise ValueError(
                    f"`gate_rows({step})` must return a non-empty sequence of row indices, got "
                    f"{candidates.size} values"
                )
            if candidates.min() < 0 or candidates.max() >= len(self._dataset):
                raise ValueError(
                    f"`gate_rows({step})` returned rows outside the training set [0, {len(self._dataset)})"
                )
        rows = generator.choice(candidates, size=min(self._rows, candidates.size), replace=False)
        batch = self._collate(self._examples(sorted(rows)))
        names = GATE_INPUTS + ("labels",) if model.config.gate_rule == "need" else GATE_INPUTS
        return {name: batch[name].to(model.device) for name in names if batch.get(name) is not None}

    def _decisions(self, args: TrainingArguments, model: DDCLIncrtPreTrainedModel, step: int) -> list:
        """Every layer's gate decision on the per-layer C = X^T X / N of a gate batch (and under
        `gate_rule="need"` its need test, `need_evidence`), averaged over processes (same decision on every
        rank)."""
        cadence = self._cadence
        self._need = None
        if model.config.gate_rule != "need":
            batch = self._gate_batch(args, model, step)
            moments = model.gate_second_moments(**batch, num_tokens=cadence["gate_num_tokens"])
        else:  # one forward of the monitor rows gives the loss and C; the gate batch only for a probe
            monitor = self._monitor_batch(args, model)
            local, local_error, moments = task_scores(model, **monitor, num_tokens=cadence["gate_num_tokens"])
            loss, fit_error = self._mean_over_processes(model, local, local_error)
            gates = [layer.attention.gate for layer in model.base_model.layers]
            deciding = any(self.history["growing"]) and any(
                gate.phase(loss, 0.0, fit_error) != "moving" for gate in gates
            )
            if deciding:
                self._need = need_evidence(
                    model,
                    **monitor,
                    loss=local,
                    fit_error=fit_error,
                    plateau_loss=loss,
                    probe_rows=lambda: self._gate_batch(args, model, step),
                )
            else:  # the loss still moves, or growth has ended: no verdict reads anything else
                self._need = [NeedEvidence.unprobed(loss, 0.0, fit_error) for _ in gates]
        if self._group is not None:
            stacked = torch.stack(moments)
            dist.all_reduce(stacked, group=self._group)
            moments = list(stacked / dist.get_world_size())
            if self._need is not None:
                averaged = torch.tensor(self._need, dtype=torch.float64, device=stacked.device)
                dist.all_reduce(averaged, group=self._group)
                averaged = (averaged / dist.get_world_size()).tolist()
                self._need = [
                    type(evidence)(*row) for evidence, row in zip(self._need, averaged, strict=True)
                ]
        return model.gate_check(
            second_moments=moments, tracker_steps=cadence["tracker_steps"], need=self._need
        )

    def _examples(self, rows: np.ndarray) -> list:
        """The training set's examples at `rows`, in their order (one batched read where the dataset has
        `__getitems__`, as `datasets.Dataset`, which the DataLoader's fetcher uses too)."""
        rows = [int(row) for row in rows]
        if hasattr(self._dataset, "__getitems__"):
            return list(self._dataset.__getitems__(rows))
        return [self._dataset[row] for row in rows]

    def _monitor_batch(self, args: TrainingArguments, model: DDCLIncrtPreTrainedModel) -> dict:
        """Under `gate_rule="need"`: the same min(`NEED_MONITOR_ROWS`, `gate_batch_size`) labelled training
        rows at every check (drawn once from all rows, seeded by args.seed and the rank; of those, in the
        drawn order, the first within `NEED_MONITOR_TOKENS` tokens, at least one), whose task loss tells a
        plateau apart from sampling noise; collated once."""
        if self._monitor is None:
            rank = dist.get_rank() if self._group is not None else 0
            generator = np.random.default_rng([args.seed, rank, NEED_MONITOR_ROWS])
            count = min(NEED_MONITOR_ROWS, self._rows, len(self._dataset))
            examples = self._examples(generator.choice(len(self._dataset), size=count, replace=False))
            lengths = np.cumsum([len(example.get("input_ids", ())) for example in examples])
            batch = self._collate(
                examples[: max(1, int(np.searchsorted(lengths, NEED_MONITOR_TOKENS, "right")))]
            )
            self._monitor = {
                name: batch[name] for name in GATE_INPUTS + ("labels",) if batch.get(name) is not None
            }
            if "labels" not in self._monitor:
                raise ValueError('`gate_rule="need"` needs a labelled training set: it has no `labels`')
        return {name: value.to(model.device) for name, value in self._monitor.items()}

    def _mean_over_processes(self, model: DDCLIncrtPreTrainedModel, *values: float) -> list[float]:
        """`values` averaged over processes, in one collective (on the model's device, which the process
        group's backend serves)."""
        if self._group is None:
            return list(values)
        total = torch.tensor(values, dtype=torch.float64, device=model.device)
        dist.all_reduce(total, group=self._group)
        return (total / dist.get_world_size()).tolist()

    def _calibrate(self, args: TrainingArguments, model: DDCLIncrtPreTrainedModel, step: int) -> None:
        """INCRT calibration on the first gate batches; their decisions are not acted on. Under
        `gate_rule="need"` first the plateau reference of the first check: the monitor rows' loss when
        growth starts (`NeedGate.record_loss`, and the history's need_reference_loss; not where a gate has
        one, e.g. a resumed run)."""
        gates = [layer.attention.gate for layer in model.base_model.layers]
        if model.config.gate_rule == "need" and any(float(gate.need_last_loss) < 0 for gate in gates):
            scores = task_scores(model, **self._monitor_batch(args, model))
            (loss,) = self._mean_over_processes(model, scores.loss)
            for gate in gates:
                if float(gate.need_last_loss) < 0:
                    gate.record_loss(loss)
            self.history["need_reference_loss"] = loss
        for _ in range(model.config.gate_calibration_checks):
            uncalibrated = [not bool(gate.calibrated) for gate in gates]
            if not any(uncalibrated):
                break
            decisions = self._decisions(args, model, step)
            for decision, gate, was_uncalibrated in zip(decisions, gates, uncalibrated, strict=True):
                if was_uncalibrated and bool(gate.calibrated):
                    self.history["events"].append(
                        {
                            "step": step,
                            "layer": decision.layer,
                            "action": "calibrated",
                            "theta_w": decision.theta_w,
                            "num_heads": list(model.config.num_heads),
                        }
                    )

    def _share_new_heads(self, heads: list[torch.nn.Module]) -> None:
        """DDP: copy rank 0's new parameters to every rank, and average their gradients at each backward."""
        if self._group is None:
            return
        world_size = dist.get_world_size()

        def average_gradient(parameter: torch.Tensor) -> None:
            dist.all_reduce(parameter.grad, group=self._group)
            parameter.grad.div_(world_size)

        for head in heads:
            for parameter in head.parameters():
                dist.broadcast(parameter.data, src=0, group=self._group)
                self._gradient_hooks[id(parameter)] = parameter.register_post_accumulate_grad_hook(
                    average_gradient
                )

    def _forget_hooks(self, head: torch.nn.Module) -> None:
        for parameter in head.parameters():
            handle = self._gradient_hooks.pop(id(parameter), None)
            if handle is not None:
                handle.remove()


def _sharded_by_fsdp(model: torch.nn.Module) -> bool:
    """Whether `fully_shard` (FSDP2) or FSDP1 wraps the model or any of its modules."""
    if not dist.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    return any(isinstance(module, (FSDPModule, FullyShardedDataParallel)) for module in model.modules())


# --------------------------------------------------------------------------------------------- history plot


def plot_growth_history(
    history: dict,
    path: str | os.PathLike,
    *,
    log_history: list[dict] | None = None,
    last_step: int | None = None,
    reference_accuracy: dict[str, float] | None = None,
):
    """PNG of a growth run read by its gate verdicts (docs/ddcl_incrt.md, 'Growth and pruning').

    Panels: heads per layer over optimizer steps 0..`last_step` (default: the last check), each verdict
    marked where it happened (grow, stop, full, prune); lambda_max(A_res) against theta_w, the threshold the
    gate compares it with, over the steps since growth started on a log axis, so that checks a few steps
    apart stay apart; and, when `log_history` (the Trainer's `state.log_history`) holds evaluations,
    validation accuracy with `reference_accuracy` lines (e.g. `{"Bayes": 0.978, "chance": 0.5}`) in its
    range. Every panel shades the warm-up (no gate) and the phase after growth stopped. Returns the
    `matplotlib.figure.Figure`, drawn on matplotlib's Agg canvas (no display, no global backend change)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    checks, events = history["checks"], history["events"]
    evaluations = [
        (entry["step"], entry["eval_accuracy"]) for entry in log_history or [] if "eval_accuracy" in entry
    ]
    if reference_accuracy is not None and not isinstance(reference_accuracy, dict):
        raise TypeError(f"`reference_accuracy` must be a dict name -> accuracy, got {reference_accuracy!r}")
    references = dict(reference_accuracy or {})
    for name, value in references.items():
        if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"`reference_accuracy` maps names to accuracies, got {name!r}: {value!r}")
        if not 0 <= value <= 1:
            raise ValueError(f"`reference_accuracy[{name!r}]` must lie in [0, 1], got {value}")
    steps = [0] + [check["step"] for check in checks]
    end = max([steps[-1], last_step or 0, *(step for step, _ in evaluations)]) or 1
    started, stopped = history.get("growth_started_at_step") or 0, history["growth_stopped_at_step"]
    figure = Figure(figsize=(7, 7.5 if evaluations else 5.5), constrained_layout=True)
    heads_axis, gate_axis, *accuracy_axes = figure.subplots(3 if evaluations else 2, 1)
    verdict_styles = {
        "grow": ("^", "grow: λ_max > θ_w, a head added"),
        "stop": ("o", "stop: λ_max ≤ θ_w, growth ends"),
        "full": ("s", "full: max_heads reached"),
        "prune": ("x", "prune: a head removed"),
    }
    colors = [f"C{layer}" for layer in range(len(history["initial_num_heads"]))]

    def shade_phases(axis, offset: int = 0, floor: float = 0.0) -> None:
        """Warm-up (no gate) and after-stop spans; `offset`: the axis counts steps from `offset`."""
        if started > 0 and offset == 0:
            axis.axvspan(0, started, color="0.9", zorder=0, label="warm-up: no gate check")
        if stopped is not None:
            axis.axvspan(
                max(stopped - offset, floor),
                end - offset,
                color="C9",
                alpha=0.15,
                zorder=0,
                label=f"growth stopped (step {stopped}): heads fixed",
            )

    # heads, with each verdict where it happened
    heads_after = {}  # (layer, step) -> heads after that step's check
    for layer, initial in enumerate(history["initial_num_heads"]):
        heads = [initial] + [check["num_heads"][layer] for check in checks]
        heads_after.update(((layer, step), count) for step, count in zip(steps, heads, strict=True))
        heads_axis.step(
            steps + [end], heads + heads[-1:], where="post", color=colors[layer], label=f"layer {layer}"
        )
    for action, (marker, label) in verdict_styles.items():
        marked = [e for e in events if e["action"] == action]
        for index, event in enumerate(marked):
            heads_axis.scatter(
                event["step"],
                heads_after[event["layer"], event["step"]],
                marker=marker,
                s=45,
                color=colors[event["layer"]],
                zorder=3,
                label=None if index else label,
            )
    shade_phases(heads_axis)
    heads_axis.set_xlim(0, end)
    heads_axis.yaxis.set_major_locator(MaxNLocator(integer=True))
    heads_axis.set_ylabel("heads")
    heads_axis.set_xlabel("optimizer step")
    heads_axis.set_title("Heads per layer, and the gate's verdicts where they happened")
    heads_axis.legend(fontsize="x-small", loc="lower right")

    # the gate: lambda_max against theta_w, on steps since growth started (log axis)
    if checks:
        since = [check["step"] - started for check in checks]
        for layer in range(len(colors)):
            gate_axis.plot(
                since,
                [check["lambda_max"][layer] for check in checks],
                marker=".",
                color=colors[layer],
                label=f"λ_max(A_res), layer {layer}",
            )
            gate_axis.plot(
                since,
                [check["theta_w"][layer] for check in checks],
                linestyle="--",
                color=colors[layer],
                label=f"θ_w, layer {layer}: grow while λ_max is above",
            )
        for action in ("grow", "stop", "full"):
            for event in (e for e in events if e["action"] == action):
                gate_axis.scatter(
                    event["step"] - started,
                    event["lambda_max"],
                    marker=verdict_styles[action][0],
                    s=45,
                    color=colors[event["layer"]],
                    zorder=3,
                )
        shade_phases(gate_axis, offset=started, floor=0.5)
        checked_after_stop = stopped is not None and checks[-1]["step"] > stopped
        if stopped is not None:
            gate_axis.text(
                0.98,
                0.04,
                "after the stop the checks only look for heads to prune:\nλ_max above θ_w adds no head"
                if checked_after_stop
                else "no check after the stop (pruning is off)",
                transform=gate_axis.transAxes,
                ha="right",
                fontsize="x-small",
            )
        measured = [value for check in checks for value in check["lambda_max"] + check["theta_w"]]
        if min(measured) > 0:  # growth decisions (small λ) and later checks (often larger) both readable
            gate_axis.set_yscale("log")
        gate_axis.set_xscale("log")
        gate_axis.set_xlim(0.8, since[-1] * (2 if stopped is not None and not checked_after_stop else 1.05))
        for axis in (gate_axis.xaxis, gate_axis.yaxis):  # ticks at 1, 2, 5 x 10^k as plain numbers
            if axis.get_scale() == "log":
                axis.set_major_locator(LogLocator(subs=(1, 2, 5)))
                axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
                axis.set_minor_formatter(NullFormatter())
        gate_axis.legend(fontsize="x-small", loc="best")
    else:
        gate_axis.text(0.5, 0.5, "no gate check ran", ha="center", va="center", transform=gate_axis.transAxes)
    gate_axis.set_xlabel(f"optimizer steps since growth started at step {started} (log scale)")
    gate_axis.set_ylabel("top eigenvalue")
    gate_axis.set_title("The gate: λ_max of the residual directional matrix A_res against θ_w")

    if evaluations:
        accuracy_axis = accuracy_axes[0]
        accuracy_axis.plot(
            *zip(*evaluations, strict=True), marker="o", color="black", label="validation accuracy"
        )
        for index, (name, value) in enumerate(references.items()):
            accuracy_axis.axhline(
                value, color=f"C{index + 3}", linestyle="-.", linewidth=1, label=f"{name} {value:.3f}"
            )
        shade_phases(accuracy_axis)
        values = [value for _, value in evaluations] + list(references.values())
        low, high = min(values), max(values)
        margin = max(0.05 * (high - low), 0.01)
        accuracy_axis.set_ylim(low - margin, high + margin)
        accuracy_axis.set_xlim(0, end)
        accuracy_axis.set_xlabel("optimizer step")
        accuracy_axis.set_ylabel("accuracy")
        accuracy_axis.legend(fontsize="x-small", loc="lower right")
    figure.savefig(path, dpi=100)
    return figure


__all__ = ["IncrtGrowthCallback", "plot_growth_history"]
