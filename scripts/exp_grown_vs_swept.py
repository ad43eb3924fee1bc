"""Grown vs swept (docs/growth_gate.md, "Grown vs swept"): does one INCRT growth run reach the accuracy of the
best fixed head count for less compute than trying the head counts?

Per task (`planted`: `exp_synthetic.py`'s planted spectral task; `cov2`: `exp_cov2.py`'s synthetic CoV-2
lineages; `sst2`: `exp_sst2.py` from scratch at batch 32), with that script's recipe and defaults unchanged;
`needs2`, `needs4`: the majority-relations task with k = 2, 4 relations (`build_majority_relations_task`,
docs/growth_gate.md, 'A task that needs k heads') on `exp_synthetic.py`'s recipe with the shape that makes
its head need k (`NEEDS_K_DEFAULTS`: [CLS] pooling, head_dim 1, no prototype loss):

- static models with every head count of `--static_heads` (default 1..8, the shapes' hidden // head_dim),
  trained in the same phases as a grown run (pre-growth, then the rest) with no growth callback, so they
  differ from the grown model by their heads only; `--seeds` seeds each;
- the grown model: one head per layer, the default (relative) gate, cap `--max_heads`; the same seeds.

Per run: validation accuracy, final heads, optimizer steps, wall time of training and the compute proxy
step-parameters = sum over optimizer steps of the trainable parameters at that step (a grown model counts its
smaller early shapes; heads add parameters linearly). Per task: static accuracy mean and std per count, the
best count, the knee (the fewest heads whose mean accuracy is within `--tolerance` of the best count's), the
grown runs' mean and std, their gate checks' median share of the training time, and the cost ratios grown /
sweep, where the sweep is one run per head count (what choosing a count costs a user; the mean cost over seeds
per count). The claim tested: the grown model within `--tolerance` (0.5 pt) of the best count at less than a
third of the sweep's cost, with its median heads at the knee (and, separately, within one head of it).

Writes `<output_dir>/<task>.json` after every run and `<task>.png` (static accuracy vs heads, grown runs
marked) at the end of a task. A run already in the file with the same kind, heads, seed, cap and task flags
(`--task_flags TASK="..."`, passed on to that task's recipe) is kept, so an interrupted sweep resumes.
`--grown_flags TASK="..."` adds flags to the grown runs only (a gate setting) and `--static_from DIR` takes
the static runs from DIR/<task>.json, so a gate change retrains only the grown models. A grown run of the
default rule also records `heads_at_factor`: the heads it would have stopped at under each higher
`gate_calibration_factor` of `STUDY_FACTORS` (docs/growth_gate.md, "Why the gate's count does not follow the
task").

    python scripts/exp_grown_vs_swept.py --tasks planted cov2 sst2
    python scripts/exp_grown_vs_swept.py --tasks planted cov2 --seeds 0 --static_heads 1 2 \\
        --output_dir outputs/gvs --task_flags planted="--max_steps 60 --pre_growth_steps 20" \\
        cov2="--genome_length 300 --max_steps 40"
"""

from __future__ import annotations

import argparse
import copy
import shlex
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from transformers import DataCollatorWithPadding, set_seed  # noqa: E402

from geoformers.training.synthetic_tasks import (  # noqa: E402
    LINEAGES,
    build_majority_relations_task,
    build_spectral_task,
    task_spec,
)

from harness import cov2, sst2, synthetic  # noqa: E402
from harness.analysis import heads_at_factor  # noqa: E402
from harness.flag_checks import CheckedParser  # noqa: E402
from harness.flags import build_model  # noqa: E402
from harness.probes import evaluate_accuracy  # noqa: E402
from harness.recipe import run_growth_training  # noqa: E402
from harness.results import (  # noqa: E402
    REPO_ROOT,
    markdown_table,
    mean_std,
    parameter_count,
    saved_runs,
    write_results,
)
from harness.threads import DEFAULT_THREADS, THREADS_HELP, set_threads  # noqa: E402

TASK_NAMES = ("planted", "cov2", "sst2", "needs2", "needs4")
STUDY_FACTORS = (0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6)
NEEDS_K_TASKS = {"needs2": 2, "needs4": 4}  # task name -> number of majority relations k
# The needs-k recipe's own defaults before `--task_flags` (docs/growth_gate.md, 'A task that needs k heads'):
# one query position, heads of one dimension, and no L_q term (with 0.1 no static model left chance).
NEEDS_K_DEFAULTS = ["--pooling", "cls", "--head_dim", "1", "--prototype_loss_weight", "0"]


@dataclass
class Trained:
    """One finished run: the model, its parameters before training, validation accuracy, optimizer steps, the
    growth history (None for a static model) and the training wall time."""

    model: torch.nn.Module
    initial_parameters: int
    accuracy: float
    steps: int
    history: dict | None
    train_time_s: float


def prepare(task: str, extra: list[str], threads: int):
    """train(seed, heads, grow, max_heads, folder, flags) -> Trained: the task's recipe (its script's parser
    and defaults, the sweep's `--threads`, then `extra`, then the run's own `flags`, which must not change
    the data) on data built once."""
    extra = ["--threads", str(threads), *extra]
    if task == "sst2":
        args = sst2.parse_args(["--per_device_train_batch_size", "32", *extra])
        set_threads(args.threads)
        _, tokenizer, (train_rows, dev) = sst2.load_data(args)

        def train(
            seed: int, heads: int, grow: bool, max_heads: int, folder: Path, flags: list[str]
        ) -> Trained:
            base = sst2.parse_args(["--per_device_train_batch_size", "32", *extra, *flags]) if flags else args
            one = argparse.Namespace(
                **{
                    **vars(base),
                    "seed": seed,
                    "initial_heads": heads,
                    "max_heads": max_heads,
                    "no_growth": not grow,
                    "output_dir": str(folder),
                }
            )
            set_seed(seed)
            model = sst2.build_model(one, tokenizer)
            initial = parameter_count(model)
            run = sst2.train(model, one, train_rows, dev, DataCollatorWithPadding(tokenizer), folder)
            return Trained(
                model,
                initial,
                run["final"]["eval_accuracy"],
                run["steps"],
                run["history"],
                run["train_time_s"],
            )

        return train
    if task == "planted" or task in NEEDS_K_TASKS:
        defaults = ["--no_ablation", *(NEEDS_K_DEFAULTS if task in NEEDS_K_TASKS else [])]

        def parse(flags: list[str]) -> argparse.Namespace:
            return synthetic.parse_args([*defaults, *extra, *flags])

        args = parse([])
        if task == "planted":
            data = build_spectral_task(
                args.strengths,
                num_train=args.num_train,
                num_validation=args.num_validation,
                seed=args.task_seed,
            )
        else:
            data = build_majority_relations_task(
                NEEDS_K_TASKS[task],
                num_train=args.num_train,
                num_validation=args.num_validation,
                seed=args.task_seed,
            )
        spec = task_spec(data)
        shape = {
            "vocab_size": spec["vocab_size"],
            "max_position_embeddings": spec["seq_len"],
            "num_labels": spec.get("num_classes", 2),
        }
    else:

        def parse(flags: list[str]) -> argparse.Namespace:
            return cov2.parse_args([*extra, *flags])

        args = parse([])
        data, vocab_size, sequence_length = cov2.build_task(args)
        shape = {
            "vocab_size": vocab_size,
            "max_position_embeddings": sequence_length,
            "num_labels": len(LINEAGES),
        }
    set_threads(args.threads)

    def train(seed: int, heads: int, grow: bool, max_heads: int, folder: Path, flags: list[str]) -> Trained:
        one = parse(flags) if flags else copy.copy(args)
        one.seed, one.initial_heads, one.max_heads = seed, heads, max_heads
        model = build_model(one, **shape)
        initial = parameter_count(model)
        run = run_growth_training(model, one, data["train"], output_dir=folder, growth=grow)
        accuracy = evaluate_accuracy(model, data["validation"], batch_size=64)
        return Trained(model, initial, accuracy, one.max_steps, run.history, run.train_time_s)

    return train


def step_parameters(history: dict | None, steps: int, initial: int, final: int) -> float:
    """Sum over optimizer steps of the trainable parameters: `initial` parameters with the history's initial
    heads, each grow / prune event (taking effect after its step) moving the count linearly in the total
    heads towards `final` (the trained model's). A static model (no history): steps x final."""
    if history is None:
        return float(steps * final)
    first, last = sum(history["initial_num_heads"]), sum(history["num_heads"])
    per_head = (final - initial) / (last - first) if last != first else 0.0
    total, heads, since = 0.0, first, 0
    for event in history["events"]:
        if event["action"] in ("grow", "prune"):
            total += (event["step"] - since) * (initial + per_head * (heads - first))
            heads, since = sum(event["num_heads"]), event["step"]
    return total + (steps - since) * (initial + per_head * (heads - first))


def run_one(train, planned: dict, folder: Path) -> dict:
    """One planned run (`plan`) -> its record: the plan's fields and what training measured."""
    trained = train(
        planned["seed"],
        planned["initial_heads"],
        planned["kind"] == "grown",
        planned["max_heads"],
        folder,
        planned.get("grown_flags", []),
    )
    final = parameter_count(trained.model)
    history = trained.history
    return {
        **planned,
        "num_heads": list(trained.model.config.num_heads),
        "accuracy": trained.accuracy,
        "steps": trained.steps,
        "initial_parameters": trained.initial_parameters,
        "parameters": final,
        "step_parameters": step_parameters(history, trained.steps, trained.initial_parameters, final),
        "train_time_s": trained.train_time_s,
        "growth_end": None
        if history is None
        else [e["action"] for e in history["events"] if e["action"] in ("stop", "full")],
        "heads_at_factor": factor_study(history, trained.model.config),
        "gate_time_s": None if history is None else history.get("gate_seconds"),
    }


def factor_study(history: dict | None, config) -> dict | None:
    """For a grown run of the default rule (max_only, relative theta_w): per `STUDY_FACTORS` entry at or
    above the run's `gate_calibration_factor`, the heads per layer it would have stopped at
    (`heads_at_factor`; docs/growth_gate.md, "Why the gate's count does not follow the task"); else None."""
    relative = config.gate_theta_w is None and config.gate_threshold == "relative"
    if history is None or not relative or config.gate_rule != "max_only":
        return None
    run_factor = config.gate_calibration_factor
    return {
        str(factor): [layer["heads"] for layer in heads_at_factor(history, factor, run_factor)]
        for factor in STUDY_FACTORS
        if factor >= run_factor
    }


def plan(args: argparse.Namespace, flags: list[str], grown_flags: list[str]) -> list[dict]:
    """The runs of a task: every static count of `--static_heads` (cap = its heads) and the grown model (one
    head, cap `--max_heads`, with `grown_flags` after the task's flags), for every seed."""
    static = [
        {"kind": "static", "seed": seed, "initial_heads": heads, "max_heads": heads, "flags": flags}
        for heads in args.static_heads
        for seed in args.seeds
    ]
    return static + [
        {
            "kind": "grown",
            "seed": seed,
            "initial_heads": 1,
            "max_heads": args.max_heads,
            "flags": flags,
            "grown_flags": grown_flags,
        }
        for seed in args.seeds
    ]


def run_key(run: dict) -> tuple:
    """What makes two runs the same run (a run saved before `--grown_flags` existed had none)."""
    return (
        run["kind"],
        run["initial_heads"],
        run["seed"],
        run["max_heads"],
        tuple(run["flags"]),
        tuple(run.get("grown_flags", ())),
    )


def summarise(runs: list[dict], tolerance: float) -> dict:
    """Static accuracy and cost per head count, the best count and the knee, the grown runs, and the claim."""
    static = {}
    for record in runs:
        if record["kind"] == "static":
            static.setdefault(record["initial_heads"], []).append(record)
    counts = []
    for heads in sorted(static):
        records = static[heads]
        accuracy, std = mean_std([r["accuracy"] for r in records])
        counts.append(
            {
                "heads": heads,
                "seeds": len(records),
                "accuracy": accuracy,
                "accuracy_std": std,
                "train_time_s": statistics.fmean(r["train_time_s"] for r in records),
                "step_parameters": statistics.fmean(r["step_parameters"] for r in records),
            }
        )
    grown = [r for r in runs if r["kind"] == "grown"]
    summary = {"static": counts, "tolerance": tolerance}
    if not counts or not grown:
        return summary
    best = max(counts, key=lambda row: row["accuracy"])
    knee = min(row["heads"] for row in counts if row["accuracy"] >= best["accuracy"] - tolerance)
    accuracy, std = mean_std([r["accuracy"] for r in grown])
    heads = [sum(r["num_heads"]) for r in grown]
    sweep_time = sum(row["train_time_s"] for row in counts)
    sweep_compute = sum(row["step_parameters"] for row in counts)
    grown_time = statistics.fmean(r["train_time_s"] for r in grown)
    grown_compute = statistics.fmean(r["step_parameters"] for r in grown)
    summary.update(
        {
            "best_static_heads": best["heads"],
            "best_static_accuracy": best["accuracy"],
            "knee_heads": knee,
            "grown": {
                "seeds": len(grown),
                "accuracy": accuracy,
                "accuracy_std": std,
                "heads": heads,
                "train_time_s": grown_time,
                "step_parameters": grown_compute,
                "gate_share": _gate_share(grown),
            },
            "sweep": {"counts": len(counts), "train_time_s": sweep_time, "step_parameters": sweep_compute},
            "gap_to_best": best["accuracy"] - accuracy,
            "time_ratio": grown_time / sweep_time,
            "compute_ratio": grown_compute / sweep_compute,
        }
    )
    summary["claim"] = {
        "within_tolerance": summary["gap_to_best"] <= tolerance,
        "under_a_third_of_the_sweep": max(summary["time_ratio"], summary["compute_ratio"]) < 1 / 3,
        "heads_at_the_knee": statistics.median(heads) == knee,
        "heads_within_one_of_the_knee": abs(statistics.median(heads) - knee) <= 1,
    }
    studied = [r["heads_at_factor"] for r in grown if r.get("heads_at_factor")]
    if len(studied) == len(grown):
        summary["factor_study"] = {
            factor: {
                "heads": [sum(study[factor]) for study in studied],
                "median": statistics.median(sum(study[factor]) for study in studied),
            }
            for factor in studied[0]
            if all(factor in study for study in studied)
        }
    return summary


def _gate_share(grown: list[dict]) -> float | None:
    """Median over grown runs of the gate checks' share of the training wall time (None where a run was saved
    before checks were timed)."""
    shares = [r["gate_time_s"] / r["train_time_s"] for r in grown if r.get("gate_time_s") is not None]
    return statistics.median(shares) if len(shares) == len(grown) else None


def plot(task: str, runs: list[dict], summary: dict, path: Path) -> None:
    """Static accuracy (mean +- std over seeds) against heads, each grown run marked at its heads."""
    figure, axis = plt.subplots(figsize=(6.4, 4.2))
    counts = summary["static"]
    axis.errorbar(
        [row["heads"] for row in counts],
        [row["accuracy"] for row in counts],
        yerr=[row["accuracy_std"] for row in counts],
        marker="o",
        capsize=3,
        label="static (mean ± std over seeds)",
    )
    grown = [r for r in runs if r["kind"] == "grown"]
    axis.scatter(
        [sum(r["num_heads"]) for r in grown],
        [r["accuracy"] for r in grown],
        marker="*",
        s=140,
        color="tab:red",
        zorder=3,
        label="grown (one run each)",
    )
    if "knee_heads" in summary:
        axis.axvline(summary["knee_heads"], color="grey", linestyle=":", label="knee")
    axis.set(xlabel="heads (all layers)", ylabel="validation accuracy", title=f"grown vs swept: {task}")
    axis.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)  # clear of the points
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


@dataclass
class SweepArguments:
    """The sweep: tasks, seeds, the static head counts, the grown models' cap, the tolerance, the flags passed
    on and where the results go."""

    tasks: list[str] = field(default_factory=lambda: list(TASK_NAMES), metadata={"choices": TASK_NAMES})
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    static_heads: list[int] = field(default_factory=lambda: list(range(1, 9)))
    max_heads: int = field(default=16, metadata={"help": "the grown models' cap"})
    tolerance: float = field(default=0.005, metadata={"help": "accuracy gap allowed (0.005: 0.5 pt)"})
    task_flags: list[str] = field(
        default_factory=list,
        metadata={
            "metavar": 'TASK="FLAGS"',
            "help": 'flags passed on to one task\'s recipe, e.g. cov2="--genome_length 600"',
        },
    )
    grown_flags: list[str] = field(
        default_factory=list,
        metadata={
            "metavar": 'TASK="FLAGS"',
            "help": "flags for one task's grown runs only, after its --task_flags (a gate setting, e.g. "
            'needs2="--gate_calibration_factor 0.3"); the static runs stay comparable',
        },
    )
    static_from: str | None = field(
        default=None,
        metadata={
            "help": "a folder of earlier results (e.g. results/grown_vs_swept): static runs found in its "
            "<task>.json are taken from there instead of trained again"
        },
    )
    output_dir: str = field(
        default=str(REPO_ROOT / "outputs" / "grown_vs_swept"),
        metadata={"help": "results/grown_vs_swept: the committed run"},
    )
    runs_dir: str = field(
        default=str(REPO_ROOT / "outputs" / "grown_vs_swept"), metadata={"help": "the runs' own folders"}
    )
    threads: int = field(default=DEFAULT_THREADS, metadata={"help": THREADS_HELP + "; passed on to the runs"})


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = CheckedParser(SweepArguments, description=__doc__.split("\n\n")[0])
    args = parser.parse_args(argv)
    if min(args.static_heads) < 1 or args.max_heads < 2:
        parser.error(
            f"--static_heads must be >= 1 and --max_heads >= 2, got {args.static_heads}, {args.max_heads}"
        )
    if not 0 <= args.tolerance < 1:
        parser.error(f"--tolerance must lie in [0, 1), got {args.tolerance}")
    for name in ("task_flags", "grown_flags"):
        per_task = {task: [] for task in TASK_NAMES}
        for item in getattr(args, name):
            task, _, flags = item.partition("=")
            if task not in TASK_NAMES:
                parser.error(f'--{name} takes TASK="FLAGS" with TASK in {list(TASK_NAMES)}, got {item!r}')
            per_task[task] = shlex.split(flags)
        setattr(args, name, per_task)
    if args.static_from is not None and not Path(args.static_from).is_dir():
        parser.error(f"--static_from must be an existing folder, got {args.static_from!r}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    results = {}
    for task in args.tasks:
        path = output / f"{task}.json"
        done = saved_runs(path, run_key)
        if args.static_from is not None:
            earlier = saved_runs(Path(args.static_from) / f"{task}.json", run_key)
            done.update({key: run for key, run in earlier.items() if run["kind"] == "static"})
        train = prepare(task, args.task_flags[task], args.threads)
        runs = []
        for planned in plan(args, args.task_flags[task], args.grown_flags[task]):
            key = run_key(planned)
            if key not in done:
                kind = "grown" if planned["kind"] == "grown" else f"static{planned['initial_heads']}"
                folder = Path(args.runs_dir) / task / kind / f"seed{planned['seed']}"
                done[key] = run_one(train, planned, folder)
            runs.append(done[key])
            # after every run: an interrupted sweep keeps its runs, resumes there
            result = write_results(
                path,
                "exp_grown_vs_swept.py",
                argv,
                vars(args),
                {
                    "experiment": "grown_vs_swept",
                    "task": task,
                    "summary": summarise(runs, args.tolerance),
                    "runs": runs,
                },
            )
        plot(task, runs, result["summary"], output / f"{task}.png")
        print(f"wrote {output / f'{task}.png'}")
        print_summary(task, result["summary"])
        results[task] = result
    return results


def print_summary(task: str, summary: dict) -> None:
    rows = [
        [
            row["heads"],
            row["seeds"],
            row["accuracy"],
            row["accuracy_std"],
            row["train_time_s"],
            f"{row['step_parameters']:.3g}",
        ]
        for row in summary["static"]
    ]
    print(markdown_table(["heads", "seeds", "accuracy", "std", "train time (s)", "step-parameters"], rows))
    if "grown" in summary:
        grown = summary["grown"]
        print(
            f"{task}: grown {grown['accuracy']:.4f} ± {grown['accuracy_std']:.4f} with heads "
            f"{grown['heads']}; best static {summary['best_static_accuracy']:.4f} at "
            f"{summary['best_static_heads']} heads, knee {summary['knee_heads']}; cost grown / sweep: "
            f"time {summary['time_ratio']:.3f}, step-parameters {summary['compute_ratio']:.3f}; "
            f"claim {summary['claim']}"
        )


if __name__ == "__main__":
    main()
