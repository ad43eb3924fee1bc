"""Stop fraction of the INCRT growth rules (docs/growth_gate.md, "Measured stop fractions").

Runs the scripts `exp_synthetic.py` (planted task), `exp_cov2.py` (synthetic CoV-2) and `exp_sst2.py` (SST-2
from scratch) unchanged, each in its own process, once per seed and growth rule, with `--max_heads` raised so
the cap is not what ends growth, and reports per rule the fraction of layer-runs whose growth ended with a
"stop" verdict (lambda_max <= theta_w, or lambda_min >= phi_w under the bidirectional rule), against "full"
(the cap) or none (still growing or dwelling when training ended). For every layer-run that did not stop,
the lambda_max and theta_w trajectory of its gate checks (at most `--trajectory_points` of them) is kept.

Task "trainer" is the library's own set-up instead of a recipe: the stock `Trainer` with
`IncrtGrowthCallback(check_every=100)` (the README's) on the planted task, a config with no gate field but
the rule's, no pre-growth phase (`trainer_defaults`).

Rules: relative (lambda_max > theta_w, theta_w = 0.1 ||A_sym||_F at each check; the default), bidirectional
(the author's rule on the relative theta_w), calibrated (lambda_max > theta_w with the author's theta_w,
calibrated once), author (bidirectional on the calibrated theta_w).

The cap is `--max_heads`, or per rule `--rule_max_heads RULE=N` (a rule that ends with more heads needs a
higher cap to stay at most half of it). Writes `<output_dir>/growth_stop_<tasks>.json` (summary, per-run cap,
trajectories of the failures) after every run, and each run's files under `<runs_dir>/<task>/<rule>/seed<k>/`.
A run already in that file with the same task, rule, seed, cap and `--extra` flags is kept, not run again, so
an interrupted sweep resumes and a sweep can be extended by seeds or rules; runs of the file that the new
invocation does not ask for are dropped.

    python scripts/exp_growth_stop.py --tasks planted cov2 --seeds 0 1 2
    python scripts/exp_growth_stop.py --tasks sst2 --seeds 0 1 2 3 4 --rule_max_heads bidirectional=24
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import Trainer, TrainingArguments

from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import GATE_RULES, GATE_THRESHOLDS, DDCLIncrtConfig
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtForSequenceClassification
from geoformers.training.growth import HISTORY_FILE, IncrtGrowthCallback
from geoformers.training.optim import make_optimizer
from geoformers.training.synthetic_tasks import build_spectral_task, task_spec

from harness.flag_checks import CheckedParser
from harness.results import REPO_ROOT, markdown_table, saved_runs, write_results
from harness.threads import DEFAULT_THREADS, THREADS_HELP, set_threads

SCRIPTS = Path(__file__).resolve().parent

RULES = {
    "relative": ["--gate_threshold", "relative", "--gate_rule", "max_only"],
    "bidirectional": ["--gate_threshold", "relative", "--gate_rule", "bidirectional"],
    "calibrated": ["--gate_threshold", "calibrated", "--gate_rule", "max_only"],
    "author": ["--gate_threshold", "calibrated", "--gate_rule", "bidirectional"],
}


@dataclasses.dataclass
class TrainerDefaultsArguments:
    """`trainer_defaults`' own flags; the training flags are `TrainingArguments`' (HfArgumentParser)."""

    gate_threshold: str = dataclasses.field(metadata={"choices": GATE_THRESHOLDS})
    gate_rule: str = dataclasses.field(metadata={"choices": GATE_RULES})
    max_heads: int = 16
    check_every: int = dataclasses.field(default=100, metadata={"help": "optimizer steps between checks"})
    threads: int = dataclasses.field(default=DEFAULT_THREADS, metadata={"help": "torch CPU threads"})


def trainer_defaults(argv: list[str]) -> None:
    """The stock Trainer and `IncrtGrowthCallback` with the library's defaults on the planted task: only the
    shape, `max_heads` and the rule's two gate fields are set; growth_history.json lands in --output_dir."""
    parser = CheckedParser((TrainerDefaultsArguments, TrainingArguments), prog="trainer_defaults")
    parser.set_defaults(
        seed=0,
        max_steps=1000,
        learning_rate=3e-3,
        per_device_train_batch_size=32,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    options, training = parser.parse_args_into_dataclasses(argv)
    training = dataclasses.replace(training, logging_steps=training.max_steps)
    set_threads(options.threads)
    task = build_spectral_task(num_train=4000, num_validation=64, seed=0)
    spec = task_spec(task)
    torch.manual_seed(training.seed)
    model = DDCLIncrtForSequenceClassification(
        DDCLIncrtConfig(
            vocab_size=spec["vocab_size"],
            hidden_size=64,
            head_dim=8,
            max_heads=options.max_heads,
            max_position_embeddings=spec["seq_len"],
            num_labels=2,
            type_vocab_size=0,
            gate_threshold=options.gate_threshold,
            gate_rule=options.gate_rule,
        )
    )
    Trainer(
        model=model,
        args=training,
        train_dataset=task["train"],
        optimizers=(make_optimizer(model, training, prototype_lr_multiplier=10.0), None),
        callbacks=[IncrtGrowthCallback(check_every=options.check_every, save_plot=False)],
    ).train()


# Each task's script (None: `trainer_defaults` in this process), its per-seed flags and where it leaves the
# growth history of a run in its output folder.
TASKS = {
    "planted": ("exp_synthetic.py", lambda seed: ["--seeds", str(seed), "--no_ablation"], "seed{seed}"),
    "cov2": ("exp_cov2.py", lambda seed: ["--seed", str(seed)], ""),
    "sst2": ("exp_sst2.py", lambda seed: ["--seed", str(seed), "--per_device_train_batch_size", "32"], ""),
    "trainer": (None, lambda seed: ["--seed", str(seed)], ""),
}


@dataclasses.dataclass
class SweepArguments:
    """The sweep: tasks x rules x seeds, the caps, the flags passed on and where the results go."""

    tasks: list[str] = dataclasses.field(
        default_factory=lambda: ["planted", "cov2"], metadata={"choices": sorted(TASKS)}
    )
    rules: list[str] = dataclasses.field(
        default_factory=lambda: list(RULES), metadata={"choices": list(RULES)}
    )
    seeds: list[int] = dataclasses.field(default_factory=lambda: [0, 1, 2])
    max_heads: int = dataclasses.field(
        default=16, metadata={"help": "cap on heads, at least twice the heads the relative rule ends with"}
    )
    rule_max_heads: list[str] = dataclasses.field(
        default_factory=list,
        metadata={
            "metavar": "RULE=N",
            "help": "a rule's own cap instead of --max_heads, e.g. bidirectional=24",
        },
    )
    trajectory_points: int = 40
    # argparse.REMAINDER: every argument after --extra, as a list of strings
    extra: str = dataclasses.field(
        default_factory=list,
        metadata={
            "nargs": argparse.REMAINDER,
            "help": "flags passed on to every task script (e.g. a smaller scale); the last flag",
        },
    )
    output_dir: str = dataclasses.field(
        default=str(REPO_ROOT / "outputs" / "growth_stop"),
        metadata={"help": "results/growth_stop: the committed run"},
    )
    runs_dir: str = dataclasses.field(
        default=str(REPO_ROOT / "outputs" / "growth_stop"), metadata={"help": "the runs' own folders"}
    )
    threads: int = dataclasses.field(
        default=DEFAULT_THREADS, metadata={"help": THREADS_HELP + "; passed on to every run"}
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = CheckedParser(SweepArguments, description=__doc__.split("\n\n")[0])
    args = parser.parse_args(argv)
    if args.max_heads < 2 or args.trajectory_points < 2:
        parser.error("--max_heads and --trajectory_points must be >= 2")
    caps = {rule: args.max_heads for rule in RULES}
    for item in args.rule_max_heads:
        rule, _, cap = item.partition("=")
        if rule not in RULES or not cap.isdigit() or int(cap) < 2:
            parser.error(f"--rule_max_heads takes RULE=N, RULE in {sorted(RULES)}, N >= 2; got {item!r}")
        caps[rule] = int(cap)
    args.caps = caps
    return args


def layer_endings(history: dict, points: int) -> list[dict]:
    """Per layer: the heads, how growth ended ("stop", "full" or None) and, unless it stopped, the gate's
    lambda_max / theta_w trajectory (evenly thinned to `points` checks, the last one kept)."""
    endings = []
    for layer, heads in enumerate(history["num_heads"]):
        ends = [e for e in history["events"] if e["layer"] == layer and e["action"] in ("stop", "full")]
        ending = {
            "layer": layer,
            "heads": heads,
            "verdict": ends[0]["action"] if ends else None,
            "step": ends[0]["step"] if ends else None,
        }
        if ending["verdict"] != "stop":
            checks = history["checks"]
            stride = max(1, -(-len(checks) // points))
            kept = checks[::stride] + ([checks[-1]] if checks and (len(checks) - 1) % stride else [])
            ending["trajectory"] = [
                {
                    "step": c["step"],
                    "lambda_max": c["lambda_max"][layer],
                    "theta_w": c["theta_w"][layer],
                    "action": c["action"][layer],
                    "heads": c["num_heads"][layer],
                }
                for c in kept
            ]
        endings.append(ending)
    return endings


def run(task: str, rule: str, seed: int, args: argparse.Namespace) -> dict:
    script, seed_flags, history_folder = TASKS[task]
    folder = Path(args.runs_dir) / task / rule / f"seed{seed}"
    argv = [
        *seed_flags(seed),
        *RULES[rule],
        "--max_heads",
        str(args.caps[rule]),
        "--threads",
        str(args.threads),
        "--output_dir",
        str(folder),
        *args.extra,
    ]
    started = time.perf_counter()
    if script is None:
        trainer_defaults(argv)
    else:
        subprocess.run([sys.executable, str(SCRIPTS / script), "--disable_tqdm", "true", *argv], check=True)
    history = json.loads((folder / history_folder.format(seed=seed) / HISTORY_FILE).read_text())
    # the recipe script's command line, or the arguments of `trainer_defaults` in this script
    command = " ".join(["trainer_defaults" if script is None else f"python scripts/{script}", *argv])
    return {
        "task": task,
        "rule": rule,
        "seed": seed,
        "max_heads": args.caps[rule],
        "extra": args.extra,
        "command": command,
        "layers": layer_endings(history, args.trajectory_points),
        "wall_time_s": time.perf_counter() - started,
    }


def summarise(runs: list[dict]) -> list[dict]:
    """Per task and rule: caps, layer-runs, how many ended with stop / full / neither, the stop fraction,
    whether every cap is at least twice the heads it ended with, and the heads."""
    rows = []
    for task in dict.fromkeys(r["task"] for r in runs):
        for rule in dict.fromkeys(r["rule"] for r in runs if r["task"] == task):
            layers = [layer for r in runs if (r["task"], r["rule"]) == (task, rule) for layer in r["layers"]]
            verdicts = [layer["verdict"] for layer in layers]
            caps = sorted({r["max_heads"] for r in runs if (r["task"], r["rule"]) == (task, rule)})
            rows.append(
                {
                    "task": task,
                    "rule": rule,
                    "max_heads": caps,
                    "layer_runs": len(layers),
                    "stop": verdicts.count("stop"),
                    "full": verdicts.count("full"),
                    "neither": verdicts.count(None),
                    "stop_fraction": verdicts.count("stop") / len(layers),
                    "cap_at_least_twice_final": all(
                        2 * layer["heads"] <= r["max_heads"]
                        for r in runs
                        if (r["task"], r["rule"]) == (task, rule)
                        for layer in r["layers"]
                    ),
                    "heads": [layer["heads"] for layer in layers],
                }
            )
    return rows


def run_key(run: dict) -> tuple:
    """What makes two runs the same run: task, rule, seed, cap and the flags passed on."""
    return run["task"], run["rule"], run["seed"], run["max_heads"], tuple(run["extra"])


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    path = output / f"growth_stop_{'_'.join(args.tasks)}.json"
    done = saved_runs(path, run_key)
    runs = []
    for task in args.tasks:
        for rule in args.rules:
            for seed in args.seeds:
                key = run_key(
                    {
                        "task": task,
                        "rule": rule,
                        "seed": seed,
                        "max_heads": args.caps[rule],
                        "extra": args.extra,
                    }
                )
                runs.append(done[key] if key in done else run(task, rule, seed, args))
                # after every run: a partial sweep still leaves its numbers
                content = {"experiment": "growth_stop", "summary": summarise(runs), "runs": runs}
                result = write_results(path, "exp_growth_stop.py", argv, vars(args), content)
    columns = (
        "task",
        "rule",
        "max_heads",
        "layer_runs",
        "stop",
        "full",
        "neither",
        "stop_fraction",
        "cap_at_least_twice_final",
        "heads",
    )
    print(
        markdown_table(
            [
                "task",
                "rule",
                "cap",
                "layer-runs",
                "stop",
                "full (cap)",
                "neither",
                "stop fraction",
                "cap >= 2 x heads",
                "final heads",
            ],
            [[row[name] for name in columns] for row in result["summary"]],
        )
    )
    return result


if __name__ == "__main__":
    main()
