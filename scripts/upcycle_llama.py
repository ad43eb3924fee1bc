"""Upcycle a trained Llama into DDL-mHC with n = 4 streams (docs/upcycling.md, "Experiment").

transformers' Llama of `bench_causal_lm.py`'s shape (4 layers, 4 heads, width 128, block 64, batch 12)
trains `--switch_step` steps on character-level tiny-shakespeare through the scripts' `Trainer`
(`harness.causal_lm.build_trainer`: AdamW lr 1e-3, warm-up and cosine decay over the whole `--max_steps`).
Then the run branches:

- "llama": the same model, optimizer and batch generator, trained on to `--max_steps`;
- "upcycled:<choice>", one per `--symmetry_breaking` choice: `convert_llama_to_ddl_mhc(llama,
  symmetry_breaking=choice, hc_streams=4, residual="add")`, whose logits equal Llama's at the switch. Each
  inherits the optimizer state of every copied weight (AdamW moments and step count), the place in the
  learning-rate schedule and the batch generator's state, so every arm sees the same batches and the same
  learning rates; the new hyper-connection maps start with fresh moments (the same random draw per arm).

All arms train round robin (one step of each in turn, so machine load slows them alike;
`harness.round_robin`: the upcycled arms' `Trainer`s join Llama's rotation at the switch) up to
`--stop_step` (default `--max_steps`; the schedule always spans `--max_steps`, so a shorter run is the
first part of the long one). The train-split and validation losses (fixed windows, `estimate_loss`) are
measured every `--eval_steps` steps, and for the upcycled arms whether the streams are used
(`hc_diagnostics`' `stream_use`: stream spread and effective rank leaving the last layer, H_res entropy,
composite gain). Writes `<output_dir>/summary.json` (the losses around the switch, the final losses, step
times, the whole history) and `<output_dir>/losses.png`.

    python scripts/upcycle_llama.py                    # -> outputs/upcycle_llama/{summary.json,losses.png}
    python scripts/upcycle_llama.py --symmetry_breaking read_spread layer_read write_spread --stop_step 1400
"""

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import TrainerCallback

import geoformers
from geoformers.models.ddl_mhc.llama_conversion import SYMMETRY_BREAKING
from geoformers.training.hc_diagnostics import hc_diagnostics, stream_use

from harness.causal_lm import (
    LLAMA,
    SMALL_CPU_SHAPE,
    build_model,
    build_trainer,
    estimate_loss,
    get_batch,
    load_corpus,
    run_settings,
)
from harness.flags import training_arguments
from harness.lm_trainer import lm_parser
from harness.results import write_results
from harness.round_robin import RoundRobin
from harness.threads import set_threads

REPO_ROOT = Path(__file__).resolve().parents[1]
UPCYCLED = "upcycled:"  # arm name prefix; the symmetry-breaking choice follows


def upcycled_arms(args) -> list[str]:
    return [UPCYCLED + choice for choice in args.symmetry_breaking]


def inherit_training_state(optimizer, schedule, model, source_optimizer, source_schedule, source_model):
    """Give `optimizer` / `schedule` (of `model`, not stepped yet) the state of the source run's at the
    switch: the AdamW state of the parameters both models share by name, the schedule's position and every
    group's current learning rate (the groups are `make_optimizer`'s, the same six in both)."""
    optimizer, source_optimizer = (getattr(o, "optimizer", o) for o in (optimizer, source_optimizer))
    schedule, source_schedule = (getattr(s, "scheduler", s) for s in (schedule, source_schedule))
    source_names = {id(param): name for name, param in source_model.named_parameters()}
    source_state = {source_names[id(param)]: state for param, state in source_optimizer.state.items()}
    for name, param in model.named_parameters():
        if name in source_state:
            optimizer.state[param] = {key: value.clone() for key, value in source_state[name].items()}
    schedule.load_state_dict(source_schedule.state_dict())
    for group, source_group in zip(optimizer.param_groups, source_optimizer.param_groups, strict=True):
        group["lr"] = source_group["lr"]


class Branch(TrainerCallback):
    """Llama's run: at the end of step `--switch_step` the upcycled models join the rotation, each with a
    `Trainer` of its own (same recipe and schedule length) that starts from this run's optimizer state,
    schedule position and batch position (`RandomWindows(skip_batches=switch)`) and stops at `--stop_step`,
    as this run does."""

    def __init__(self, experiment: "Experiment"):
        self.experiment = experiment

    def on_step_end(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        if state.global_step == self.experiment.args.switch_step:
            self.experiment.branch(model, optimizer, lr_scheduler)
        if state.global_step == self.experiment.args.stop_step:
            control.should_training_stop = True


class Inherit(TrainerCallback):
    """The upcycled run: takes the source run's state before its first step, stops after `steps` steps."""

    def __init__(self, source: tuple, steps: int):
        self.source, self.steps = source, steps

    def on_train_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        inherit_training_state(optimizer, lr_scheduler, model, *self.source)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.steps:
            control.should_training_stop = True


class Evaluate(TrainerCallback):
    """Every `--eval_steps` steps of the experiment, the losses of every model there (`Experiment.evaluate`);
    `offset`: the step the run started from."""

    def __init__(self, experiment: "Experiment", arm: str, offset: int):
        self.experiment, self.arm, self.offset = experiment, arm, offset

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step + self.offset
        if step % self.experiment.args.eval_steps == 0:
            self.experiment.evaluate(step, self.arm)


def evaluate(models: dict, train_ids, val_ids, args, device) -> dict:
    """{arm: {"train": loss, "val": loss}} on fixed windows of both splits."""
    return {
        arm: {
            split: estimate_loss(
                model, ids, args.per_device_train_batch_size, args.block_size, args.eval_batches, 0, device
            )
            for split, ids in (("train", train_ids), ("val", val_ids))
        }
        for arm, model in models.items()
    }


@torch.no_grad()
def logit_gap(model, reference, val_ids, args, device) -> float:
    """Max |logits - reference logits| on one validation batch: the conversion's exactness at the switch."""
    batch = get_batch(
        val_ids, args.per_device_train_batch_size, args.block_size, torch.Generator().manual_seed(1)
    ).to(device)
    model.eval()
    reference.eval()
    gap = (model(batch).logits - reference(batch).logits).abs().max().item()
    model.train()
    reference.train()
    return gap


def streams_used(model, val_ids, args) -> dict:
    """Whether the upcycled streams are used, on one validation batch (`stream_use`: spread and effective
    rank of the last layer's streams, H_res entropy, composite gain); nothing for one stream."""
    if model.config.hc_streams == 1:
        return {}
    batch = get_batch(
        val_ids, args.per_device_train_batch_size, args.block_size, torch.Generator().manual_seed(1)
    )
    return stream_use(hc_diagnostics(model, batch))


class Experiment:
    """Both phases through the scripts' `Trainer`s in lockstep (`harness.round_robin`): Llama's run, which the
    upcycled run joins at the switch."""

    def __init__(self, args, device):
        self.args, self.device = args, device
        self.tokenizer, self.train_ids, self.val_ids = load_corpus(args.data)
        torch.manual_seed(args.seed)
        llama = build_model(LLAMA, self.tokenizer, args.block_size, dict(SMALL_CPU_SHAPE)).to(device)
        self.models = {"llama": llama}
        self.history = [{"step": 0, **evaluate(self.models, self.train_ids, self.val_ids, args, device)}]
        self.switch_gap = None
        trainer = build_trainer(llama, self.train_ids, args)
        trainer.add_callback(Branch(self))
        trainer.add_callback(Evaluate(self, "llama", offset=0))
        self.trainers = {"llama": trainer}
        self.rotation = RoundRobin(self.trainers)

    def branch(self, llama, optimizer, schedule) -> None:
        args = self.args
        self.switch_gap = {}
        for arm, choice in zip(upcycled_arms(args), args.symmetry_breaking, strict=True):
            torch.manual_seed(args.seed)  # the same random start of the new maps in every arm
            upcycled = geoformers.convert_llama_to_ddl_mhc(
                llama, symmetry_breaking=choice, hc_streams=args.hc_streams, residual="add"
            )
            self.models[arm] = upcycled
            self.switch_gap[arm] = logit_gap(upcycled, llama, self.val_ids, args, self.device)
            print(
                f"switch at step {args.switch_step}, {arm}: max |logit difference| {self.switch_gap[arm]:.2e}"
            )
            trainer = build_trainer(upcycled, self.train_ids, args, skip_batches=args.switch_step)
            trainer.add_callback(Inherit((optimizer, schedule, llama), args.stop_step - args.switch_step))
            trainer.add_callback(Evaluate(self, arm, offset=args.switch_step))
            self.trainers[arm] = trainer
            self.rotation.add(arm, trainer)

    def evaluate(self, step: int, arm: str) -> None:
        """After the switch the last upcycled run, which steps after all others, evaluates every arm."""
        if arm != list(self.models)[-1] and step > self.args.switch_step:
            return
        self.history.append(
            {"step": step, **evaluate(self.models, self.train_ids, self.val_ids, self.args, self.device)}
        )
        for name, model in self.models.items():
            if name.startswith(UPCYCLED):
                self.history[-1][name].update(streams_used(model, self.val_ids, self.args))
        report = ", ".join(f"{arm} val {self.history[-1][arm]['val']:.4f}" for arm in self.models)
        print(f"step {step}: {report}", flush=True)

    def run(self) -> dict:
        seconds = self.rotation.train()
        losses = {
            arm: [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
            for arm, trainer in self.trainers.items()
        }
        return {
            "losses": losses,
            "seconds": seconds,
            "history": self.history,
            "switch_gap": self.switch_gap,
            "parameters": {arm: model.num_parameters() for arm, model in self.models.items()},
        }


def run(args, device) -> dict:
    """Both phases; returns the per-step training losses and seconds, the evaluations and the switch gaps."""
    check_branches(args)
    return Experiment(args, device).run()


def summarize(args, result: dict) -> dict:
    """The numbers of docs/upcycling.md: losses around the switch, final losses, step times."""
    switch, losses, history = args.switch_step, result["losses"], result["history"]
    upcycled, arms = upcycled_arms(args), ["llama", *upcycled_arms(args)]
    after = {arm: losses[arm][-(args.stop_step - switch) :] for arm in arms}  # steps switch + 1 .. stop
    differences = {
        arm: [up - base for up, base in zip(after[arm], after["llama"], strict=True)] for arm in upcycled
    }
    window = args.spike_window
    at_switch = next(entry for entry in history if entry["step"] == switch)
    final = history[-1]
    return {
        "switch_step": switch,
        "steps": args.stop_step,
        "schedule_steps": args.max_steps,
        "hc_streams": args.hc_streams,
        "parameters": result["parameters"],
        "max_abs_logit_difference_at_switch": result["switch_gap"],
        "val_loss_at_switch": {arm: at_switch[arm]["val"] for arm in arms},
        "train_loss_last_step_before_switch": losses["llama"][switch - 1],
        "train_loss_first_step_after_switch": {arm: after[arm][0] for arm in arms},
        f"train_loss_difference_first_{window}_steps_after_switch": {
            arm: {"max": max(difference[:window]), "mean": statistics.mean(difference[:window])}
            for arm, difference in differences.items()
        },
        f"train_loss_difference_last_{window}_steps": {
            arm: statistics.mean(difference[-window:]) for arm, difference in differences.items()
        },
        "final_val_loss": {arm: final[arm]["val"] for arm in arms},
        "final_stream_use": {
            arm: {key: value for key, value in final[arm].items() if key not in ("train", "val")}
            for arm in upcycled
        },
        "final_train_split_loss": {arm: final[arm]["train"] for arm in arms},
        "median_step_seconds": {
            "llama before switch": statistics.median(result["seconds"]["llama"][:switch]),
            **{
                f"{arm} after switch": statistics.median(result["seconds"][arm][-len(after[arm]) :])
                for arm in arms
            },
        },
        "history": history,
    }


def running_mean(values: list[float], width: int) -> list[float]:
    return [statistics.mean(values[max(0, i - width + 1) : i + 1]) for i in range(len(values))]


def plot(args, result: dict, path: Path) -> None:
    """Left: each upcycled arm's per-step training loss minus Llama's (same batches, running mean 50);
    middle: validation loss minus Llama's; right: the stream spread leaving the last layer (log scale)."""
    from matplotlib.figure import Figure

    switch, losses, history = args.switch_step, result["losses"], result["history"]
    figure = Figure(figsize=(15, 4.2))
    gap, validation, spread = figure.subplots(1, 3)
    for arm in upcycled_arms(args):
        label = arm.removeprefix(UPCYCLED)
        steps = list(range(switch + 1, switch + 1 + len(losses[arm])))
        difference = [up - base for up, base in zip(losses[arm], losses["llama"][switch:], strict=False)]
        gap.plot(steps, running_mean(difference, 50), lw=1.2, label=label)
        evaluated = [entry for entry in history if arm in entry]
        validation.plot(
            [entry["step"] for entry in evaluated],
            [entry[arm]["val"] - entry["llama"]["val"] for entry in evaluated],
            "o-",
            ms=3,
            label=label,
        )
        measured = [entry for entry in evaluated if "stream_spread_last" in entry[arm]]  # none for n = 1
        spread.semilogy(
            [entry["step"] for entry in measured],
            [max(entry[arm]["stream_spread_last"], 1e-9) for entry in measured],
            "o-",
            ms=3,
            label=label,
        )
    for axis in (gap, validation):
        axis.axhline(0.0, color="grey", lw=0.8)
        axis.set_ylabel("loss difference to Llama (nats / char)")
    for axis in (gap, validation, spread):
        axis.set_xlabel("step")
        axis.legend(fontsize=8)
    gap.set_title("per-step training loss - Llama's (running mean 50)")
    validation.set_title("validation loss - Llama's")
    spread.set_title("stream spread ||X - mean X|| / ||X||, last layer")
    figure.suptitle(f"upcycled n={args.hc_streams} (add) after step {switch}, by symmetry breaking")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


@dataclass
class UpcycleArguments:
    """The switch, the upcycled model's streams and the summary's windows (`--eval_steps`: the train and
    validation losses every N steps)."""

    _argument_group_name = "upcycling"

    switch_step: int = field(default=1000, metadata={"help": "Llama steps before the conversion"})
    hc_streams: int = field(default=4, metadata={"help": "streams of the upcycled DDL-mHC"})
    spike_window: int = field(default=50, metadata={"help": "steps after the switch summarised"})
    symmetry_breaking: list[str] = field(
        default_factory=lambda: ["read_spread"],
        metadata={
            "help": "the exact starts to compare, one upcycled arm each (docs/upcycling.md)",
            "choices": SYMMETRY_BREAKING,
        },
    )
    stop_step: int | None = field(
        default=None,
        metadata={"help": "last step trained (default --max_steps, which the schedule always spans)"},
    )


def check_branches(args) -> None:
    """--symmetry_breaking distinct; --stop_step (None: --max_steps) after the switch, a multiple of
    --eval_steps."""
    if len(set(args.symmetry_breaking)) != len(args.symmetry_breaking):
        raise ValueError(f"--symmetry_breaking must name distinct choices, got {args.symmetry_breaking}")
    if args.stop_step is None:
        args.stop_step = args.max_steps
    if not args.switch_step < args.stop_step <= args.max_steps or args.stop_step % args.eval_steps:
        raise ValueError(
            f"--stop_step must be a multiple of --eval_steps after --switch_step, at most --max_steps; got "
            f"{args.stop_step}"
        )


def make_parser():
    return lm_parser(
        UpcycleArguments,
        description=__doc__,
        output_dir=str(REPO_ROOT / "outputs" / "upcycle_llama"),
        eval_steps=50,
    )


def main() -> None:
    parser = make_parser()
    args = parser.parse_args()
    if args.eval_steps is None or args.eval_steps < 1 or args.eval_steps != int(args.eval_steps):
        parser.error(f"--eval_steps must be a whole number of steps >= 1, got {args.eval_steps}")
    args.eval_steps = int(args.eval_steps)
    if args.switch_step % args.eval_steps or not 0 < args.switch_step < args.max_steps:
        parser.error("--switch_step must be a multiple of --eval_steps, between 0 and --max_steps")
    if args.max_steps % args.eval_steps:
        parser.error("--max_steps must be a multiple of --eval_steps")
    parser.checked(check_branches, args)
    set_threads(args.threads)
    device = training_arguments(args).device
    start = time.perf_counter()
    result = run(args, device)
    summary = {
        "date": time.strftime("%Y-%m-%d"),
        "wall_seconds": time.perf_counter() - start,
        **summarize(args, result),
    }
    shown = {key: value for key, value in summary.items() if key != "history"}
    print(json.dumps(shown, indent=2))
    output_dir = Path(args.output_dir)
    write_results(
        output_dir / "summary.json", "upcycle_llama.py", None, run_settings(args, UpcycleArguments), summary
    )
    plot(args, result, output_dir / "losses.png")
    print(f"wrote {output_dir / 'losses.png'}")


if __name__ == "__main__":
    main()
