"""The main job: DDCL-INCRT grows its attention heads on a task generated on the spot (no download).

The task is the planted spectral task (`build_spectral_task`): a binary label carried by k directional
token relations of decreasing strength, with a known Bayes accuracy. DDCL-INCRT starts with one head per
layer, trains `--pre_growth_steps` steps, then `IncrtGrowthCallback` adds a head along the top eigenvector u+
of the deflated residual A_res whenever lambda_max(A_res) > theta_w = 0.1 ||A_sym||_F, until it stops
(`scripts/harness/recipe.py` explains the recipe). Growth events are printed as they happen; at the end a
summary (heads per layer, lambda_max at each event, validation accuracy against the Bayes accuracy) and the
output folder: checkpoint (config.json + model.safetensors, reloads with `from_pretrained`),
growth_history.json, growth_history.png (heads, lambda_max and validation accuracy over the whole run) and
summary.json. Warm-up and growth are one `Trainer` run with one progress bar (`IncrtGrowthCallback`'s
`start_step`).

    python scripts/grow_demo.py                                  # a few minutes on 2 CPU cores
    python scripts/grow_demo.py --max_steps 60 --pre_growth_steps 20 --num_train 256 --output_dir outputs/demo
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import transformers

import geoformers  # noqa: F401  (registers the Auto classes)
from geoformers.modeling.ddcl_incrt import DDCLIncrtForSequenceClassification
from geoformers.training.synthetic_tasks import DEFAULT_STRENGTHS, build_spectral_task, task_spec

from harness.analysis import stop_summary
from harness.flags import build_model, check_experiment_arguments, experiment_parser, parsed_settings
from harness.probes import evaluate_accuracy
from harness.recipe import run_growth_training
from harness.results import events_table, markdown_table, parameter_count, write_results
from harness.threads import set_threads


@dataclass
class TaskArguments:
    """The planted spectral task (`build_spectral_task`)."""

    _argument_group_name = "task (build_spectral_task)"

    strengths: list[float] = field(
        default_factory=lambda: list(DEFAULT_STRENGTHS),
        metadata={"help": "planted relation strengths, strictly decreasing in (0, 1)"},
    )
    num_train: int = 4000
    num_validation: int = 1000
    vocab_size: int = 48
    seq_len: int = 24
    task_seed: int = field(default=0, metadata={"help": "seed of the generated task"})


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = experiment_parser(
        TaskArguments,
        description=__doc__.split("\n\n")[0],
        max_steps=2000,
        eval_steps=500,
        output_dir="outputs/grow_demo",
    )
    args = parser.parse_args(argv)
    check_experiment_arguments(parser, args)
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    set_threads(args.threads)
    started = time.perf_counter()
    output_dir = Path(args.output_dir)
    task = build_spectral_task(
        args.strengths,
        num_train=args.num_train,
        num_validation=args.num_validation,
        vocab_size=args.vocab_size,
        seq_len=args.seq_len,
        seed=args.task_seed,
    )
    spec = task_spec(task)
    model = build_model(args, vocab_size=args.vocab_size, max_position_embeddings=args.seq_len, num_labels=2)
    print(
        f"Task: {len(spec['relations'])} planted directional relations (strengths {args.strengths}), "
        f"{args.num_train} training rows of {args.seq_len} tokens, "
        f"Bayes accuracy {spec['bayes_accuracy']:.4f}"
    )
    print(
        f"Model: DDCL-INCRT, {args.num_hidden_layers} layer(s), heads {model.config.num_heads} (at most "
        f"{model.config.max_heads} per layer), {parameter_count(model):,} parameters; growth starts after "
        f"{args.pre_growth_steps} of {args.max_steps} steps, gate check every {args.check_every} steps"
    )

    run = run_growth_training(
        model, args, task["train"], output_dir=output_dir, eval_dataset=task["validation"], print_events=True
    )
    accuracy = evaluate_accuracy(model, task["validation"])
    transformers.utils.logging.disable_progress_bar()  # no bars for writing and reloading the checkpoint
    model.save_pretrained(output_dir)
    reloaded = DDCLIncrtForSequenceClassification.from_pretrained(output_dir)
    transformers.utils.logging.enable_progress_bar()
    history = run.history
    summary = {
        "task": {
            "name": "spectral_relations",
            "strengths": args.strengths,
            "bayes_accuracy": spec["bayes_accuracy"],
            "num_train": args.num_train,
            "num_validation": args.num_validation,
        },
        "initial_num_heads": history["initial_num_heads"],
        "num_heads": list(model.config.num_heads),
        "growth_started_at_step": history["growth_started_at_step"],
        "growth_stopped_at_step": history["growth_stopped_at_step"],
        "growth_end": stop_summary(history),
        "events": history["events"],
        "validation_accuracy": accuracy,
        "validation_accuracy_history": run.evaluations,
        "parameters": parameter_count(model),
        "reloaded_num_heads": list(reloaded.config.num_heads),
        "train_time_s": run.train_time_s,
        "wall_time_s": time.perf_counter() - started,
    }
    summary = write_results(output_dir / "summary.json", "grow_demo.py", argv, parsed_settings(args), summary)
    print_summary(summary, output_dir)
    return summary


def print_summary(summary: dict, output_dir: Path) -> None:
    print("\n## Heads per layer")
    rows = [
        [end["layer"], initial, final, end["verdict"] or "still growing", end["step"]]
        for end, initial, final in zip(
            summary["growth_end"], summary["initial_num_heads"], summary["num_heads"], strict=True
        )
    ]
    print(markdown_table(["layer", "initial heads", "final heads", "growth ended by", "at step"], rows))
    print("\n## Growth events (lambda_max = top eigenvalue of the deflated residual A_res)")
    print(events_table(summary))
    print("\n## Accuracy")
    accuracy, bayes = summary["validation_accuracy"], summary["task"]["bayes_accuracy"]
    print(
        markdown_table(
            ["validation accuracy", "Bayes accuracy", "ratio", "parameters", "train time"],
            [
                [
                    accuracy,
                    bayes,
                    accuracy / bayes,
                    f"{summary['parameters']:,}",
                    f"{summary['train_time_s']:.0f} s",
                ]
            ],
        )
    )
    print(f"\nCheckpoint reloads with heads {summary['reloaded_num_heads']}. Contents of {output_dir}/:")
    files = sorted(path for path in output_dir.iterdir() if path.is_file())
    width = max(len(path.name) for path in files)
    for path in files:
        print(f"  {path.name:<{width}}  {path.stat().st_size:>10,} bytes")
    print(
        json.dumps(
            {
                "validation_accuracy": round(summary["validation_accuracy"], 4),
                "num_heads": summary["num_heads"],
            }
        )
    )


if __name__ == "__main__":
    main()
