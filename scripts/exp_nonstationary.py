"""Non-stationary experiment (docs/experiments.md, 'exp_nonstationary.py'): does the INCRT gate, with no
external signal, prune heads that stop carrying directional energy and grow new ones after the
label-generating structure switches?

The stream (`build_nonstationary_stream`) uses one set of planted directional relations before
`--switch_step` and a disjoint set (other tokens) from it on; the phase-0 relation tokens no longer occur.
Training reads it in order, one batch per step (sequential sampling). The growth phase runs in windows of
`--window_steps` (`run_growth_training`): each window's gate batches come from that window's rows only (the
gate never sees future rows) and growth is re-armed every window, at boundaries fixed in time (the default
boundaries 150, 250, ... do not coincide with the switch at 500). The gate's threshold is the "relative" one
(theta_w = 0.1 ||A_sym||_F at every check), and pruning is on: phi_g = `--gate_prune_factor` x theta_w
(0.5: a head whose directional energy stays under 5 % of ||A_sym||_F for `--gate_prune_patience` = 10
checks is removed).

Every `--probe_every` steps a probe on held-out rows of the current step (a second stream, other seed)
records accuracy and each head's directional energy ||C M_a^h||_F, the prune criterion. Reported: events
around the switch, whether heads were pruned or grown after it, energies before and after, accuracy on both
phases at the end. Writes `<output_dir>`/nonstationary.json and nonstationary.png, and
growth_history.{json,png}.

Growth windows re-arm the gate, so heads are also grown (and pruned) in windows where nothing changed: one run
cannot tell a response to the switch from that background. `--seeds` runs, for every seed, the switching
stream and a stationary control (`--stationary`: phase-0 relations throughout, same seeds), each in
`<output_dir>/seed<N>/{switch,stationary}`, and writes `<output_dir>/summary.json`: grow / prune events per
run before and after `--switch_step`, and their totals over the seeds for both streams. `--continuous` drops
the windows: one callback (`regrow=True`) runs the whole growth phase and each check draws its gate batch
from the rows of the last `--window_steps` steps (`IncrtGrowthCallback(gate_rows=...)`); events are still
counted per `--window_steps` bin.

    python scripts/exp_nonstationary.py
    python scripts/exp_nonstationary.py --seeds 0 1 2 --output_dir results/nonstationary_seeds
    python scripts/exp_nonstationary.py --max_steps 40 --switch_step 20 --pre_growth_steps 10 \\
        --window_steps 10 --output_dir outputs/nonstationary
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from geoformers.models.ddcl_incrt.incrt import DEFAULT_GATE_TOKENS  # noqa: E402
from geoformers.training.synthetic_tasks import DEFAULT_STRENGTHS, build_nonstationary_stream, task_spec  # noqa: E402

from harness.flags import (  # noqa: E402
    build_model,
    check_experiment_arguments,
    experiment_parser,
    parsed_settings,
)
from harness.probes import PrototypeProbe, evaluate_accuracy, head_energies, rows_as_batch  # noqa: E402
from harness.recipe import run_growth_training  # noqa: E402
from harness.results import REPO_ROOT, events_table, markdown_table, write_results  # noqa: E402
from harness.threads import set_threads  # noqa: E402


@dataclass
class StreamArguments:
    """The stream (`build_nonstationary_stream`; its length is --max_steps) and the experiment's windows,
    probes and seeds."""

    _argument_group_name = "stream (build_nonstationary_stream) and experiment"

    strengths_before: list[float] = field(default_factory=lambda: list(DEFAULT_STRENGTHS))
    strengths_after: list[float] = field(default_factory=lambda: list(DEFAULT_STRENGTHS))
    switch_step: int = 500
    task_seed: int = field(
        default=0, metadata={"help": "training stream: task_seed + 2 x seed; held-out stream: one more"}
    )
    stationary: bool = field(
        default=False,
        metadata={
            "help": "control: phase-0 relations throughout (no switch); events still split at --switch_step"
        },
    )
    window_steps: int = field(
        default=100,
        metadata={"help": "steps per growth window (gate batches from the window; growth re-armed)"},
    )
    continuous: bool = field(
        default=False,
        metadata={"help": "one regrowing callback, gate batches from the last --window_steps steps"},
    )
    heldout_rows: int = field(default=128, metadata={"help": "held-out rows per probe"})
    seeds: list[int] | None = field(
        default=None,
        metadata={"help": "run these seeds, each with the switch and --stationary, and summarise"},
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The script's flags and the shared ones with its defaults (`--output_dir results/nonstationary`: the
    committed run)."""
    parser = experiment_parser(
        StreamArguments,
        description=__doc__.split("\n\n")[0],
        max_steps=1000,
        pre_growth_steps=150,
        gate_prune_factor=0.5,
        gate_prune_patience=10,
        lr_scheduler_type="constant",
        probe_every=10,
        eval_steps=1000,
        output_dir=str(REPO_ROOT / "outputs" / "nonstationary"),
    )
    args = parser.parse_args(argv)
    check_experiment_arguments(parser, args)
    if not args.pre_growth_steps < args.switch_step < args.max_steps:
        parser.error(
            f"--switch_step must lie between --pre_growth_steps ({args.pre_growth_steps}) and "
            f"--max_steps ({args.max_steps}), got {args.switch_step}"
        )
    for name in ("window_steps", "heldout_rows"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.seeds is not None and (len(set(args.seeds)) != len(args.seeds) or min(args.seeds) < 0):
        parser.error(f"--seeds must be distinct non-negative integers, got {args.seeds}")
    return args


class SwitchProbe(PrototypeProbe):
    """`PrototypeProbe` that also measures, at `switch_step` (weights trained on pre-switch rows only), every
    head's prune criterion ||C M_a^h||_F on the held-out rows of the step before and of the switch step: the
    same weights on the two phases' data, so the ratio is what the data shift alone does to the criterion."""

    def __init__(self, batch, every: int, switch_step: int, num_tokens: int = DEFAULT_GATE_TOKENS):
        super().__init__(batch, every, num_tokens)
        self.switch_step = switch_step
        self.at_switch: dict | None = None

    def on_step_end(self, args, state, control, model=None, **kwargs):
        super().on_step_end(args, state, control, model=model, **kwargs)
        if state.global_step + self.step_offset == self.switch_step:
            before, after = (
                head_energies(model, self.batch(step), self.num_tokens)  # eval mode inside, mode restored
                for step in (self.switch_step - 1, self.switch_step)
            )
            ratio = [
                [a / max(b, 1e-30) for a, b in zip(layer_after, layer_before, strict=True)]
                for layer_after, layer_before in zip(after, before, strict=True)
            ]
            self.at_switch = {
                "step": self.switch_step,
                "rows_before": before,
                "rows_after": after,
                "ratio": ratio,
            }


def build_streams(args: argparse.Namespace) -> tuple:
    """Training and held-out streams (seeds task_seed + 2 seed and one more); with `--stationary` both use the
    phase-0 relations for all `max_steps` steps (the first steps of a stream that would switch after them)."""
    switch = args.max_steps if args.stationary else args.switch_step
    streams = []
    for seed in (args.task_seed + 2 * args.seed, args.task_seed + 2 * args.seed + 1):
        stream = build_nonstationary_stream(
            args.strengths_before,
            args.strengths_after,
            num_steps=args.max_steps + args.stationary,
            batch_size=args.per_device_train_batch_size,
            switch_step=switch,
            seed=seed,
        )
        streams.append(
            stream.select(range(args.max_steps * args.per_device_train_batch_size))
            if args.stationary
            else stream
        )
    return tuple(streams)


def energy_change(records: list[dict], switch_step: int, span: int) -> list[dict]:
    """Per layer and head index: mean directional energy over the probes of the `span` steps before the switch
    and of the last `span` steps (indices are positions: after a prune the later heads move down)."""
    before = [r for r in records if switch_step - span <= r["step"] < switch_step]
    last_step = records[-1]["step"]
    after = [r for r in records if r["step"] > last_step - span]
    heads = []
    for layer in range(len(records[-1]["head_energy"])):
        for head in range(max(len(r["head_energy"][layer]) for r in before + after)):
            means = [
                float(
                    np.mean(
                        [r["head_energy"][layer][head] for r in group if len(r["head_energy"][layer]) > head]
                        or [np.nan]
                    )
                )
                for group in (before, after)
            ]
            heads.append({"layer": layer, "head": head, "before_switch": means[0], "at_end": means[1]})
    return heads


def events_per_window(events: list[dict], boundaries: list[int], max_steps: int) -> list[dict]:
    """Grow / prune / stop / full events counted per growth window [start, end) (a window's first check is at
    start + check_every, so an event at step `end` belongs to the window ending there)."""
    windows = []
    for start, end in zip(boundaries, boundaries[1:] + [max_steps], strict=True):
        inside = [e for e in events if start < e["step"] <= end]
        windows.append(
            {
                "start": start,
                "end": end,
                **{
                    action: sum(e["action"] == action for e in inside)
                    for action in ("grow", "prune", "stop", "full")
                },
            }
        )
    return windows


def plot(result: dict, history: dict, path: Path) -> None:
    records, switch = result["probes"], result["switch_step"]
    steps = [r["step"] for r in records]
    figure, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    accuracy_axis, energy_axis, gate_axis, heads_axis = axes.flat
    accuracy_axis.plot(steps, [r["accuracy"] for r in records])
    accuracy_axis.set(ylabel="held-out accuracy (current step)", title="accuracy on the stream")
    max_heads = max(max(r["num_heads"]) for r in records)
    for head in range(max_heads):
        energy_axis.plot(
            steps,
            [r["head_energy"][0][head] if len(r["head_energy"][0]) > head else np.nan for r in records],
            label=f"head {head}",
        )
    checks = history["checks"]
    energy_axis.plot(
        [c["step"] for c in checks],
        [result["settings"]["gate_prune_factor"] * c["theta_w"][0] for c in checks],
        color="black",
        linestyle="--",
        linewidth=0.8,
        label="phi_g (layer 0)",
    )
    energy_axis.set(yscale="log", ylabel="||C M_a^h||_F (layer 0)", title="directional energy per head index")
    energy_axis.legend(fontsize=7, ncol=2)
    gate_axis.plot(
        [c["step"] for c in checks],
        [c["lambda_max"][0] for c in checks],
        marker=".",
        label="lambda_max(A_res)",
    )
    gate_axis.plot(
        [c["step"] for c in checks], [c["theta_w"][0] for c in checks], linestyle="--", label="theta_w"
    )
    for action, marker in (("grow", "^"), ("prune", "v")):
        events = [e for e in history["events"] if e["action"] == action and e["layer"] == 0]
        heights = [e.get("lambda_max", e["theta_w"]) for e in events]  # a prune event has no lambda_max
        gate_axis.scatter([e["step"] for e in events], heights, marker=marker, zorder=3, label=action)
    gate_axis.set(yscale="log", xlabel="optimizer step", title="INCRT gate, layer 0")
    gate_axis.legend(fontsize=8)
    heads_axis.step(steps, [sum(r["num_heads"]) for r in records], where="post")
    heads_axis.set(xlabel="optimizer step", ylabel="heads (all layers)", title="heads")
    for axis in axes.flat:
        axis.axvline(switch, color="tab:red", linestyle=":", linewidth=1)
        for boundary in result["window_boundaries"]:
            axis.axvline(boundary, color="grey", linewidth=0.4)
    bins = "event bins" if result["settings"]["continuous"] else "growth windows"
    figure.suptitle(f"non-stationary stream (red: switch, grey: {bins})")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    set_threads(args.threads)
    if args.seeds is None:
        return run(args, argv)
    return run_seeds(args, argv)


def run_seeds(args: argparse.Namespace, argv: list[str] | None) -> dict:
    """Every seed on the switching stream and on the stationary control; grow / prune counts before and after
    --switch_step per run and summed over the seeds -> summary.json."""
    runs = []
    for seed in args.seeds:
        for stationary in (False, True):
            stream = "stationary" if stationary else "switch"
            print(f"== seed {seed}, {stream} stream")
            output_dir = Path(args.output_dir) / f"seed{seed}" / stream
            run_args = argparse.Namespace(
                **{
                    **vars(args),
                    "seed": seed,
                    "stationary": stationary,
                    "seeds": None,
                    "output_dir": str(output_dir),
                }
            )
            result = run(run_args, argv)
            counts = {
                f"{action}_{when}": sum(
                    e["action"] == action and (e["steps_after_switch"] >= 0) == late for e in result["events"]
                )
                for action in ("grow", "prune")
                for when, late in (("before", False), ("after", True))
            }
            runs.append(
                {
                    "seed": seed,
                    "stream": stream,
                    **counts,
                    "heads_before_switch": result["verdicts"]["heads_before_switch"],
                    "heads_at_end": result["verdicts"]["heads_at_end"],
                    "energy_ratio_at_switch": result["energy_at_switch"]["ratio"],
                }
            )
    totals = {
        stream: {
            key: sum(r[key] for r in runs if r["stream"] == stream)
            for key in ("grow_before", "grow_after", "prune_before", "prune_after")
        }
        for stream in ("switch", "stationary")
    }
    summary = {
        "experiment": "nonstationary_seeds",
        "switch_step": args.switch_step,
        "seeds": args.seeds,
        "runs": runs,
        "totals": totals,
    }
    summary = write_results(
        Path(args.output_dir) / "summary.json", "exp_nonstationary.py", argv, parsed_settings(args), summary
    )
    print(
        markdown_table(
            [
                "seed",
                "stream",
                "grow before",
                "grow after",
                "prune before",
                "prune after",
                "heads before switch",
                "heads at end",
            ],
            [
                [
                    r["seed"],
                    r["stream"],
                    r["grow_before"],
                    r["grow_after"],
                    r["prune_before"],
                    r["prune_after"],
                    r["heads_before_switch"],
                    r["heads_at_end"],
                ]
                for r in runs
            ],
        )
    )
    print(f"totals over seeds {args.seeds} (events split at step {args.switch_step}): {totals}")
    return summary


def run(args: argparse.Namespace, argv: list[str] | None) -> dict:
    """One run on one stream (module docstring) -> its result, also written to nonstationary.json."""
    started = time.perf_counter()
    output_dir = Path(args.output_dir)
    train, heldout = build_streams(args)
    spec = task_spec(train)
    model = build_model(
        args, vocab_size=spec["vocab_size"], max_position_embeddings=spec["seq_len"], num_labels=2
    )

    def heldout_rows(step: int) -> dict:
        first = min(step * args.per_device_train_batch_size, len(heldout) - args.heldout_rows)
        return rows_as_batch(heldout, range(first, first + args.heldout_rows))

    probe = SwitchProbe(heldout_rows, args.probe_every, args.switch_step, args.gate_num_tokens)
    windows = {("gate_window_steps" if args.continuous else "window_steps"): args.window_steps}
    print(
        f"stream of {args.max_steps} steps, switch at {args.switch_step}; "
        f"{'gate batches from the last' if args.continuous else 'growth windows of'} {args.window_steps} "
        f"steps after {args.pre_growth_steps} pre-growth steps"
    )
    run = run_growth_training(
        model,
        args,
        train.remove_columns(["step", "phase"]),
        output_dir=output_dir,
        probe=probe,
        print_events=True,
        sequential=True,
        **windows,
    )
    history = run.history
    switch = args.switch_step
    boundaries = list(range(args.pre_growth_steps, args.max_steps, args.window_steps))
    events = [{**event, "steps_after_switch": event["step"] - switch} for event in history["events"]]
    heads_before_switch = history["initial_num_heads"]
    for event in history["events"]:
        if event["step"] < switch and event["action"] in ("grow", "prune"):
            heads_before_switch = event["num_heads"]
    phases = np.asarray(heldout["phase"])
    accuracy_per_phase = [
        evaluate_accuracy(model, heldout.select(np.flatnonzero(phases == p)[:1024]))
        if (phases == p).any()
        else None
        for p in (0, 1)
    ]
    checks = history["checks"]
    result = {
        "experiment": "nonstationary",
        "stationary": args.stationary,
        "switch_step": switch,
        "window_boundaries": boundaries,
        "bayes_accuracy": [phase["bayes_accuracy"] for phase in spec["phases"]],
        "verdicts": {
            "pruned_after_switch": any(e["action"] == "prune" and e["step"] >= switch for e in events),
            "grown_after_switch": any(e["action"] == "grow" and e["step"] >= switch for e in events),
            "pruned_before_switch": any(e["action"] == "prune" and e["step"] < switch for e in events),
            "grown_before_switch": any(e["action"] == "grow" and e["step"] < switch for e in events),
            "heads_before_switch": heads_before_switch,
            "heads_at_end": list(model.config.num_heads),
        },
        "thresholds": [
            {
                "layer": layer,
                "first_check": {
                    "step": checks[0]["step"],
                    "theta_w": first,
                    "phi_g": args.gate_prune_factor * first,
                },
                "last_check": {
                    "step": checks[-1]["step"],
                    "theta_w": last,
                    "phi_g": args.gate_prune_factor * last,
                },
            }
            for layer, (first, last) in enumerate(
                zip(checks[0]["theta_w"], checks[-1]["theta_w"], strict=True)
            )
        ]
        if checks
        else [],
        "events_per_window": events_per_window(history["events"], boundaries, args.max_steps),
        "energy_change": energy_change(probe.records, switch, span=min(100, switch - args.pre_growth_steps)),
        "energy_at_switch": probe.at_switch,
        "final_accuracy_per_phase": accuracy_per_phase,
        "events": events,
        "probes": probe.records,
        "train_time_s": run.train_time_s,
        "wall_time_s": time.perf_counter() - started,
    }
    result = write_results(
        output_dir / "nonstationary.json", "exp_nonstationary.py", argv, parsed_settings(args), result
    )
    plot(result, history, output_dir / "nonstationary.png")
    print(f"wrote {output_dir / 'nonstationary.png'}")
    print_summary(result, history)
    return result


def print_summary(result: dict, history: dict) -> None:
    print(events_table(history))
    print(
        markdown_table(
            ["layer", "head index", "mean energy before switch", "mean energy at end"],
            [[h["layer"], h["head"], h["before_switch"], h["at_end"]] for h in result["energy_change"]],
        )
    )
    at_switch = result["energy_at_switch"]
    print(
        markdown_table(
            [
                "layer",
                "head",
                f"energy on rows of step {at_switch['step'] - 1}",
                f"on rows of step {at_switch['step']}",
                "ratio",
            ],
            [
                [layer, head, before, after, ratio]
                for layer, rows in enumerate(
                    zip(at_switch["rows_before"], at_switch["rows_after"], at_switch["ratio"], strict=True)
                )
                for head, (before, after, ratio) in enumerate(zip(*rows, strict=True))
            ],
        )
    )
    print(
        markdown_table(
            ["window", "grow", "prune", "stop", "full"],
            [
                [f"({w['start']}, {w['end']}]", w["grow"], w["prune"], w["stop"], w["full"]]
                for w in result["events_per_window"]
            ],
        )
    )
    print(
        markdown_table(
            ["layer", "check", "step", "theta_w", "phi_g"],
            [
                [t["layer"], which, t[which]["step"], t[which]["theta_w"], t[which]["phi_g"]]
                for t in result["thresholds"]
                for which in ("first_check", "last_check")
            ],
        )
    )
    accuracy = result["final_accuracy_per_phase"]
    print(
        f"final held-out accuracy: phase 0 (before the switch) {accuracy[0]:.4f}, phase 1 "
        f"{'-' if accuracy[1] is None else f'{accuracy[1]:.4f}'}; Bayes {result['bayes_accuracy']}"
    )
    print("verdicts:", result["verdicts"])


if __name__ == "__main__":
    main()
