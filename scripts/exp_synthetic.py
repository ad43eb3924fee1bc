"""Synthetic spectral experiment (docs/experiments.md, 'exp_synthetic.py'): INCRT growth on the planted
spectral task.

Checks, for several seeds on the same data (`build_spectral_task`, k planted directional relations):

1. heads are added in decreasing eigenvalue order: lambda_max(A_res) at successive grow events of a layer,
   next to the exact (float64 eigh) eigenvalues of A_sym on a fixed batch when growth starts, and the number
   of those above theta_w (the heads a gate acting on that one spectrum would grow);
2. growth stops after finitely many heads (a "stop" verdict, lambda_max <= theta_w, before `max_heads`);
3. per-head temperatures split into local heads (tau falls towards tau_min) and global heads
   (`temperature_split`: local when tau moved more than halfway from tau_init to tau_min);
4. prototype separation over training: min_{i != j} ||p_i - p_j|| per head, probed every `--probe_every`
   steps; a head counts as collapsed when its final value is below `--collapse_ratio` times its first;
5. uniqueness: the final head counts of the seeds;
plus the head-count law K* (`head_count_law` on the gate's trajectory, `spectrum_head_count_law` on the exact
spectrum at growth start) and validation accuracy against the Bayes accuracy. An ablation
run starts growth at step 0 (no pre-growth training, so the gate sees untrained weights) to show why the
recipe trains first.

Writes `<output_dir>`/synthetic.json and synthetic.png, and each run's growth_history.{json,png} in
`<output_dir>`/<run>/ (default outputs/synthetic; results/synthetic is the committed run).

    python scripts/exp_synthetic.py
    python scripts/exp_synthetic.py --seeds 0 --max_steps 40 --pre_growth_steps 10 --num_train 256 \\
        --output_dir outputs/synthetic
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from geoformers.training.synthetic_tasks import build_spectral_task, task_spec  # noqa: E402

from harness.analysis import (  # noqa: E402
    grow_order,
    head_count_law,
    spectrum_head_count_law,
    stop_summary,
    temperature_split,
    theta_at_growth_start,
)
from harness.flags import build_model, parsed_settings  # noqa: E402
from harness.probes import PrototypeProbe, evaluate_accuracy, gate_spectrum, rows_as_batch  # noqa: E402
from harness.recipe import run_growth_training  # noqa: E402
from harness.results import markdown_table, write_results  # noqa: E402
from harness.synthetic import parse_args  # noqa: E402
from harness.threads import set_threads  # noqa: E402


def prototype_separation(records: list[dict], collapse_ratio: float) -> list[dict]:
    """Per layer and head index: min pairwise prototype distance at its first and last probe, and whether it
    collapsed (last < collapse_ratio x first). Head indices are positions; no head is pruned here."""
    final = records[-1]
    heads = []
    for layer, distances in enumerate(final["min_prototype_distance"]):
        for head, last in enumerate(distances):
            first = next(
                r["min_prototype_distance"][layer][head]
                for r in records
                if len(r["min_prototype_distance"][layer]) > head
            )
            heads.append(
                {
                    "layer": layer,
                    "head": head,
                    "first": first,
                    "final": last,
                    "final_perplexity": final["prototype_perplexity"][layer][head],
                    "collapsed": last < collapse_ratio * first,
                }
            )
    return heads


def run_one(args: argparse.Namespace, task, name: str, seed: int, pre_growth_steps: int) -> dict:
    """One growth run; the exact A_sym spectrum on the probe rows is taken when growth starts."""
    run_args = copy.copy(args)
    run_args.seed, run_args.pre_growth_steps = seed, pre_growth_steps
    model = build_model(
        run_args,
        vocab_size=task_spec(task)["vocab_size"],
        max_position_embeddings=task_spec(task)["seq_len"],
        num_labels=2,
    )
    probe_batch = rows_as_batch(task["validation"], range(args.probe_rows))
    probe = PrototypeProbe(probe_batch, args.probe_every, args.gate_num_tokens)
    inputs = {key: probe_batch[key] for key in ("input_ids", "attention_mask")}
    spectrum = {}

    def at_growth_start(start: int, end: int) -> None:
        if start == pre_growth_steps:
            spectrum["eigenvalues"] = gate_spectrum(model, inputs, num_tokens=args.gate_num_tokens)

    run = run_growth_training(
        model,
        run_args,
        task["train"],
        output_dir=Path(args.output_dir) / name,
        probe=probe,
        on_window=at_growth_start,
    )
    if probe.records[-1]["step"] != args.max_steps:
        probe.record(model, args.max_steps)
    history = run.history
    order = grow_order(history)
    thetas = theta_at_growth_start(history, model)
    return {
        "run": name,
        "seed": seed,
        "pre_growth_steps": pre_growth_steps,
        "num_heads": list(model.config.num_heads),
        "growth_end": stop_summary(history),
        "grow_order": order,
        "exact_spectrum_at_growth_start": [
            eigenvalues[: len(layer["grow_lambdas"]) + 3]
            for eigenvalues, layer in zip(spectrum["eigenvalues"], order, strict=True)
        ],
        "theta_w": thetas,
        "head_count_law": {
            "trajectory": head_count_law(history),
            "spectrum_at_growth_start": spectrum_head_count_law(
                spectrum["eigenvalues"], thetas, list(model.config.num_heads)
            ),
        },
        "temperatures": temperature_split(probe.records[-1]["temperatures"], args.tau_min, args.tau_init),
        "prototype_separation": prototype_separation(probe.records, args.collapse_ratio),
        "validation_accuracy": evaluate_accuracy(model, task["validation"]),
        "events": history["events"],
        "probes": probe.records,
        "train_time_s": run.train_time_s,
    }


def plot(result: dict, path: Path) -> None:
    runs, ablation = result["runs"], result["ablation"]
    figure, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    order_axis, heads_axis, separation_axis, tau_axis = axes.flat
    for run in runs:
        lambdas = run["grow_order"][0]["grow_lambdas"]
        line = order_axis.plot(range(1, len(lambdas) + 1), lambdas, marker="o", label=run["run"])[0]
        exact = run["exact_spectrum_at_growth_start"][0]
        order_axis.plot(
            range(1, len(exact) + 1),
            exact,
            linestyle=":",
            color=line.get_color(),
            label=f"exact eigenvalues at growth start, seed {run['seed']}",
        )
        if run["theta_w"]:
            order_axis.axhline(run["theta_w"][0], color=line.get_color(), linestyle="--", linewidth=0.8)
    order_axis.set(
        xlabel="grow event (layer 0) / eigenvalue index",
        ylabel="lambda_max(A_res)",
        yscale="log",
        title="grow order vs exact spectrum (dashed: theta_w)",
    )
    order_axis.legend(fontsize=7)
    for run in runs + ([ablation] if ablation else []):
        changes = [e for e in run["events"] if e["action"] in ("grow", "prune")]
        steps = [0] + [e["step"] for e in changes] + [result["settings"]["max_steps"]]
        heads = [sum(run["probes"][0]["num_heads"])] + [sum(e["num_heads"]) for e in changes]
        style = "--" if run is ablation else "-"
        heads_axis.step(steps, heads + heads[-1:], where="post", linestyle=style, label=run["run"])
    heads_axis.set(xlabel="optimizer step", ylabel="heads (all layers)", title="heads over training")
    heads_axis.legend(fontsize=8)
    first = runs[0]
    steps = [r["step"] for r in first["probes"]]
    for head in range(first["num_heads"][0]):
        values = [
            r["min_prototype_distance"][0][head] if len(r["min_prototype_distance"][0]) > head else None
            for r in first["probes"]
        ]
        separation_axis.plot(
            steps, [v if v is not None else float("nan") for v in values], label=f"head {head}"
        )
    separation_axis.set(
        xlabel="optimizer step",
        ylabel="min_{i!=j} ||p_i - p_j||",
        yscale="log",
        title=f"prototype separation, layer 0, {first['run']}",
    )
    separation_axis.legend(fontsize=8)
    for index, run in enumerate(runs):
        taus = run["temperatures"][0]["temperatures"]
        tau_axis.scatter([index] * len(taus), taus, label=run["run"])
    tau_axis.axhline(result["tau_min"], color="grey", linestyle=":", label="tau_min")
    tau_axis.axhline(
        runs[0]["temperatures"][0]["threshold"],
        color="grey",
        linestyle="--",
        label="local / global threshold",
    )
    tau_axis.set(
        xticks=range(len(runs)),
        xticklabels=[run["run"] for run in runs],
        ylabel="tau per head",
        title="final temperatures, layer 0",
    )
    tau_axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv, __doc__.split("\n\n")[0])
    set_threads(args.threads)
    started = time.perf_counter()
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    task = build_spectral_task(
        args.strengths, num_train=args.num_train, num_validation=args.num_validation, seed=args.task_seed
    )
    runs = []
    for seed in args.seeds:
        print(f"seed {seed}: growth after {args.pre_growth_steps} pre-growth steps")
        runs.append(run_one(args, task, f"seed{seed}", seed, args.pre_growth_steps))
    ablation = None
    if args.ablation:
        print(f"ablation: seed {args.seeds[0]}, growth from step 0")
        ablation = run_one(args, task, f"seed{args.seeds[0]}_growth_from_step0", args.seeds[0], 0)
    counts = [run["num_heads"] for run in runs]
    result = {
        "experiment": "synthetic",
        "task": {
            "strengths": args.strengths,
            "relations": len(args.strengths),
            "bayes_accuracy": task_spec(task)["bayes_accuracy"],
        },
        "tau_min": args.tau_min,
        "tau_init": args.tau_init,
        "verdicts": {
            "grow_order_decreasing": all(layer["decreasing"] for run in runs for layer in run["grow_order"]),
            "finite_stop": all(end["verdict"] == "stop" for run in runs for end in run["growth_end"]),
            "local_heads": sum(len(layer["local_heads"]) for run in runs for layer in run["temperatures"]),
            "global_heads": sum(len(layer["global_heads"]) for run in runs for layer in run["temperatures"]),
            "collapsed_heads": sum(head["collapsed"] for run in runs for head in run["prototype_separation"]),
            "head_counts": counts,
            "unique_head_count": all(count == counts[0] for count in counts),
        },
        "runs": runs,
        "ablation": ablation,
        "wall_time_s": time.perf_counter() - started,
    }
    result = write_results(
        output_dir / "synthetic.json", "exp_synthetic.py", argv, parsed_settings(args), result
    )
    plot(result, output_dir / "synthetic.png")
    print(f"wrote {output_dir / 'synthetic.png'}")
    print_summary(result)
    return result


def print_summary(result: dict) -> None:
    rows = []
    for run in result["runs"] + ([result["ablation"]] if result["ablation"] else []):
        laws = run["head_count_law"]
        for end, order, trajectory, spectrum in zip(
            run["growth_end"],
            run["grow_order"],
            laws["trajectory"],
            laws["spectrum_at_growth_start"],
            strict=True,
        ):
            rows.append(
                [
                    run["run"],
                    end["layer"],
                    run["num_heads"][end["layer"]],
                    end["verdict"],
                    end["step"],
                    ", ".join(f"{value:.3g}" for value in order["grow_lambdas"]),
                    f"{order['decreasing_pairs']}/{order['pairs']}",
                    ", ".join(f"{value:.3g}" for value in spectrum["captured_eigenvalues"]),
                    spectrum["theta_w"],
                    trajectory["predicted_heads"],
                    spectrum["predicted_heads"],
                    run["validation_accuracy"],
                ]
            )
    print(
        markdown_table(
            [
                "run",
                "layer",
                "heads",
                "growth ended",
                "at step",
                "lambda_max at grow events",
                "decreasing pairs",
                "exact eigenvalues > theta_w at growth start",
                "theta_w",
                "K* (trajectory)",
                "K* (spectrum)",
                "val. accuracy",
            ],
            rows,
        )
    )
    print(f"Bayes accuracy {result['task']['bayes_accuracy']:.4f}")
    rows = [
        [
            run["run"],
            layer["layer"],
            ", ".join(f"{tau:.3g}" for tau in layer["temperatures"]),
            layer["local_heads"],
            layer["global_heads"],
        ]
        for run in result["runs"]
        for layer in run["temperatures"]
    ]
    print(markdown_table(["run", "layer", "tau per head", "local heads", "global heads"], rows))
    rows = [
        [
            run["run"],
            head["layer"],
            head["head"],
            head["first"],
            head["final"],
            head["final_perplexity"],
            head["collapsed"],
        ]
        for run in result["runs"]
        for head in run["prototype_separation"]
    ]
    print(
        markdown_table(
            [
                "run",
                "layer",
                "head",
                "min proto. distance (first probe)",
                "(final)",
                "used prototypes (final)",
                "collapsed",
            ],
            rows,
        )
    )
    print("verdicts:", result["verdicts"])


if __name__ == "__main__":
    main()
