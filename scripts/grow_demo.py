"""The main job: DDCL-INCRT grows its attention heads on a task generated on the spot (no download).

The task is the planted spectral task (`build_spectral_task`): a binary label carried by k directional
token relations of decreasing strength, with a known Bayes accuracy. DDCL-INCRT starts with one head per
layer, trains `--pre_growth_steps` steps, then `IncrtGrowthCallback` adds a head along the top eigenvector u+
of the deflated residual A_res whenever lambda_max(A_res) > theta_w = 0.1 ||A_sym||_F, until it stops
(`scripts/harness/recipe.py` explains the recipe). It prints how the gate decides, then one sentence per
growth event as it happens (what was measured, against what, what was decided) above a single progress
bar, and at the end tables (heads per layer, growth events, accuracy against the Bayes accuracy) and the
same in words. Output folder: checkpoint (config.json + model.safetensors, reloads with `from_pretrained`),
growth_history.json, growth_history.png (heads with the gate's verdicts, lambda_max against theta_w,
validation accuracy against the Bayes accuracy and chance) and summary.json. Warm-up and growth are one
`Trainer` run (`IncrtGrowthCallback`'s `start_step`).

    python scripts/grow_demo.py                                  # about a minute on 2 CPU cores
    python scripts/grow_demo.py --max_steps 60 --pre_growth_steps 20 --num_train 256 --output_dir outputs/demo
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path

import transformers

import geoformers  # noqa: F401  (registers the Auto classes)
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtForSequenceClassification
from geoformers.training.growth import PLOT_FILE, plot_growth_history
from geoformers.training.synthetic_tasks import DEFAULT_STRENGTHS, build_spectral_task, task_spec

from harness.analysis import stop_summary
from harness.flags import build_model, check_experiment_arguments, experiment_parser, parsed_settings
from harness.probes import evaluate_accuracy
from harness.recipe import run_growth_training
from harness.results import events_table, markdown_table, parameter_count, write_results
from harness.threads import set_threads

CHANCE = 0.5  # two balanced labels


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
        f"Task: a binary label carried by {len(spec['relations'])} planted directional token relations of "
        f"strengths {args.strengths}, generated on the spot: {args.num_train} training rows of "
        f"{args.seq_len} tokens; the best possible validation accuracy (Bayes) is "
        f"{spec['bayes_accuracy']:.4f}, chance is {CHANCE}."
    )
    print(
        f"Model: DDCL-INCRT, {args.num_hidden_layers} layer(s) starting with heads {model.config.num_heads} "
        f"(at most {model.config.max_heads} per layer), {parameter_count(model):,} parameters. It trains "
        f"{args.pre_growth_steps} steps with the gate off, then the gate checks every {args.check_every} "
        f"step(s) until step {args.max_steps}."
    )
    print(gate_explanation(model.config))
    run = run_growth_training(
        model, args, task["train"], output_dir=output_dir, eval_dataset=task["validation"], print_events=True
    )
    accuracy = evaluate_accuracy(model, task["validation"])
    plot_growth_history(  # the callback's figure, with the Bayes and chance lines this task knows
        run.history,
        output_dir / PLOT_FILE,
        log_history=run.log_history,
        last_step=args.max_steps,
        reference_accuracy={"Bayes": spec["bayes_accuracy"], "chance": CHANCE},
    )
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
        "chance_accuracy": CHANCE,
        "validation_accuracy_history": run.evaluations,
        "parameters": parameter_count(model),
        "reloaded_num_heads": list(reloaded.config.num_heads),
        "train_time_s": run.train_time_s,
        "wall_time_s": time.perf_counter() - started,
    }
    summary = write_results(output_dir / "summary.json", "grow_demo.py", argv, parsed_settings(args), summary)
    print_summary(summary, output_dir)
    return summary


def gate_explanation(config) -> str:
    """How the gate decides, in words (docs/ddcl_incrt.md, 'The spectral gate')."""
    if config.gate_theta_w is not None:
        threshold = f"a fixed threshold theta_w = {config.gate_theta_w:g}"
    elif config.gate_threshold == "relative":
        threshold = (
            f"the threshold theta_w = {config.gate_calibration_factor:g} x ||A_sym||_F, a fixed share of the "
            "size of the whole directional matrix"
        )
    else:
        threshold = (
            f"the threshold theta_w = {config.gate_calibration_factor:g} x the median ||A_res||_F of the "
            "first checks, then fixed"
        )
    return (
        "How the gate decides: at each check it measures, per layer, lambda_max, the largest eigenvalue of "
        "A_res, the part of the layer's directional token statistics (A_sym) that its current heads do not "
        f"capture yet. It adds a head along that direction when lambda_max is above {threshold}, and stops "
        "growing the layer the first time it is not."
    )


def summary_in_words(summary: dict, output_dir: Path) -> str:
    """The run's outcome as sentences: how each layer grew and why it ended, accuracy against Bayes and
    chance, where the model and the figure are."""
    sentences = []
    events = summary["events"]
    for end, initial, final in zip(
        summary["growth_end"], summary["initial_num_heads"], summary["num_heads"], strict=True
    ):
        layer = end["layer"]
        grown = [e["step"] for e in events if e["layer"] == layer and e["action"] == "grow"]
        text = f"Layer {layer} went from {initial} to {final} head(s)"
        if grown:
            text += f", growing at step(s) {', '.join(map(str, grown))}"
        if end["verdict"] == "stop":
            text += (
                f"; growth ended at step {end['step']}, when lambda_max ({end['lambda_max']:.3g}) was no "
                f"longer above theta_w ({end['theta_w']:.3g})."
            )
        elif end["verdict"] == "full":
            text += f"; growth ended at step {end['step']}, when the layer reached max_heads."
        else:
            text += "; the gate gave it no stop verdict before training ended, so more steps may grow it."
        sentences.append(text)
    accuracy, bayes = summary["validation_accuracy"], summary["task"]["bayes_accuracy"]
    sentences.append(
        f"The grown model classifies {accuracy:.1%} of the {summary['task']['num_validation']:,} validation "
        f"rows correctly: {accuracy / bayes:.1%} of the best possible on this task (Bayes accuracy "
        f"{bayes:.1%}), against {summary['chance_accuracy']:.0%} by chance."
    )
    sentences.append(
        f"It is saved in {output_dir}/ ({summary['parameters']:,} parameters) and reloads with heads "
        f"{summary['reloaded_num_heads']}: AutoModelForSequenceClassification.from_pretrained("
        f"{str(output_dir)!r}); {PLOT_FILE} there shows the heads, lambda_max against theta_w, and the "
        "accuracy."
    )
    return "\n".join(sentences)


def print_summary(summary: dict, output_dir: Path) -> None:
    print("\n## Heads per layer")
    rows = [
        [end["layer"], initial, final, end["verdict"] or "still growing", end["step"]]
        for end, initial, final in zip(
            summary["growth_end"], summary["initial_num_heads"], summary["num_heads"], strict=True
        )
    ]
    print(markdown_table(["layer", "initial heads", "final heads", "growth ended by", "at step"], rows))
    print("\n## Growth events (lambda_max: top eigenvalue of A_res; grow while it is above theta_w)")
    print(events_table(summary))
    print("\n## Accuracy")
    accuracy, bayes = summary["validation_accuracy"], summary["task"]["bayes_accuracy"]
    print(
        markdown_table(
            ["validation accuracy", "Bayes accuracy", "share of Bayes", "parameters", "train time"],
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
    print(f"\nFiles in {output_dir}/:")
    files = sorted(path for path in output_dir.iterdir() if path.is_file())
    width = max(len(path.name) for path in files)
    for path in files:
        print(f"  {path.name:<{width}}  {path.stat().st_size:>10,} bytes")
    print("\n## In words\n" + summary_in_words(summary, output_dir))


if __name__ == "__main__":
    main()
