"""Growth events as they happen: one line per event, and the Trainer's progress bar without its raw logs."""

from __future__ import annotations

from tqdm.auto import tqdm
from transformers import TrainerCallback
from transformers.trainer_callback import ProgressCallback

from geoformers.training.growth import IncrtGrowthCallback


def describe_event(event: dict) -> str:
    """One line per growth-history event, e.g. `step 204: layer 0 grow -> heads [2] (lambda_max ...)`."""
    text = f"step {event['step']}: layer {event['layer']} {event['action']}"
    if event["action"] == "calibrated":
        return f"{text}: theta_w = {event['theta_w']:.4g}"
    if event["action"] == "prune":
        return (
            f"{text} head {event['head']} -> heads {event['num_heads']} (directional energy "
            f"{event['energy']:.4g} below phi_g for gate_prune_patience checks)"
        )
    relation = ">" if event["lambda_max"] > event["theta_w"] else "<="
    return (
        f"{text} -> heads {event['num_heads']} (lambda_max {event['lambda_max']:.4g} {relation} theta_w "
        f"{event['theta_w']:.4g})"
    )


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
        for event in events[self.printed :]:
            tqdm.write("INCRT " + describe_event({**event, "step": event["step"] + self.step_offset}))
        self.printed = len(events)

    def on_train_begin(self, args, state, control, **kwargs):
        self._print_new()

    def on_step_end(self, args, state, control, **kwargs):
        self._print_new()

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if metrics and "eval_accuracy" in metrics:
            tqdm.write(
                f"step {state.global_step + self.step_offset}: validation accuracy "
                f"{metrics['eval_accuracy']:.4f}"
            )


class ProgressBarOnly(ProgressCallback):
    """The Trainer's progress bar without its raw log records (`GrowthEventPrinter` prints what matters)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        return
