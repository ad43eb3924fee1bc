"""Growth events as they happen: one line per event, and the Trainer's progress bar without its raw logs."""

from __future__ import annotations

from tqdm.auto import tqdm
from transformers import TrainerCallback
from transformers.trainer_callback import ProgressCallback

from geoformers.training.growth import IncrtGrowthCallback


def describe_event(event: dict) -> str:
    """One plain sentence per growth-history event: what the gate measured, against what, what it decided,
    e.g. `step 201: layer 0 grows a head, heads [1] -> [2]: lambda_max = 0.3505 is above theta_w = 0.0526.`
    (lambda_max: top eigenvalue of the deflated A_res; docs/ddcl_incrt.md, 'The spectral gate')."""
    step, layer, action, heads = event["step"], event["layer"], event["action"], event["num_heads"]
    text = f"step {step}: layer {layer}"
    if action == "calibrated":
        return f"{text} sets its threshold theta_w = {event['theta_w']:.4g} (this check only calibrates)."
    if action == "prune":
        return (
            f"{text} prunes head {event['head']}, heads now {heads}: its directional energy "
            f"{event['energy']:.4g} stayed below phi_g = gate_prune_factor x theta_w for "
            "gate_prune_patience checks."
        )
    measured = f"lambda_max = {event['lambda_max']:.4g}"
    if action == "grow":
        before = [count - (index == layer) for index, count in enumerate(heads)]
        return (
            f"{text} grows a head, heads {before} -> {heads}: {measured} is above theta_w = "
            f"{event['theta_w']:.4g}, so a new head takes that direction."
        )
    if action == "full":
        return (
            f"{text} stops at heads {heads}: {measured} is above theta_w = {event['theta_w']:.4g}, but the "
            "layer has max_heads heads."
        )
    return (
        f"{text} stops growing at heads {heads}: {measured} is not above theta_w = "
        f"{event['theta_w']:.4g}, so no direction left is strong enough for a new head."
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
            tqdm.write(describe_event({**event, "step": event["step"] + self.step_offset}))
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
    """The Trainer's progress bar without its raw log records (`GrowthEventPrinter` prints what matters) and
    without the evaluation bar (a second bar under the training bar breaks the lines printed between)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        return

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        return
