"""Command-line flags of the DDCL-INCRT experiment scripts (docs/experiments.md, 'Flags'): `HfArgumentParser`
over the script's own dataclasses, the shared `ModelArguments`, `GrowthArguments`, `RecipeArguments` and
`TrainingArguments` itself, so every training flag is the `Trainer`'s (each script sets its own defaults with
`parser.set_defaults`); the model the flags describe."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

from transformers import TrainingArguments, set_seed

from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import GATE_RULES, GATE_THRESHOLDS, DDCLIncrtConfig
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtForSequenceClassification

from harness.flag_checks import CheckedParser
from harness.threads import DEFAULT_THREADS, THREADS_HELP

TRAINING_FIELD_DEFAULTS = {
    f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    for f in dataclasses.fields(TrainingArguments)
    if f.init
}
TRAINING_FIELDS = frozenset(TRAINING_FIELD_DEFAULTS)

# The recipe's `TrainingArguments` defaults (a script's `set_defaults` overrides them): CPU, no checkpoints,
# no reporting, evaluation batches of 256.
TRAINING_DEFAULTS = {
    "max_steps": 1000,
    "per_device_train_batch_size": 32,
    "per_device_eval_batch_size": 256,
    "learning_rate": 3e-3,
    "weight_decay": 0.01,
    "warmup_steps": 20,
    "eval_steps": 250,
    "seed": 0,
    "use_cpu": True,
    "save_strategy": "no",
    "report_to": "none",
}


@dataclass
class ModelArguments:
    """The classifier's `DDCLIncrtConfig` fields."""

    _argument_group_name = "model (DDCLIncrtConfig fields)"

    hidden_size: int = 64
    num_hidden_layers: int = 1
    head_dim: int = 8
    initial_heads: int = field(default=1, metadata={"help": "heads per layer before growth"})
    max_heads: int | None = field(default=None, metadata={"help": "default hidden_size // head_dim"})
    num_prototypes: int = 16
    tau_init: float = 1.0
    tau_min: float = 0.05
    prototype_loss_weight: float = field(default=0.1, metadata={"help": "lambda in CE + lambda L_q"})
    pooling: str = field(default="mean", metadata={"choices": ("cls", "mean")})
    dropout: float | None = field(default=0.0, metadata={"help": "hidden and classifier dropout"})


@dataclass
class GrowthArguments:
    """When and how the INCRT gate grows heads (docs/growth_gate.md)."""

    _argument_group_name = "growth (INCRT gate)"

    pre_growth_steps: int = field(
        default=200,
        metadata={"help": "steps the initial heads train before theta_w is calibrated and growth starts"},
    )
    check_every: int = field(
        default=1,
        metadata={
            "help": "optimizer steps between gate checks (1: every growth decision is taken on nearly the "
            "same spectrum; training between checks inflates lambda_max)"
        },
    )
    gate_batch_size: int = field(default=64, metadata={"help": "training rows per gate check"})
    gate_num_tokens: int = field(default=512, metadata={"help": "tokens per gate check"})
    gate_threshold: str | None = field(
        default=None,
        metadata={
            "choices": GATE_THRESHOLDS,
            "help": "theta_w = factor x ||A_sym||_F at every check (relative) or calibrated once on the "
            "first checks and then fixed (calibrated, the author's rule); default: the config's (relative)",
        },
    )
    gate_rule: str | None = field(
        default=None,
        metadata={
            "choices": GATE_RULES,
            "help": "grow on lambda_max > theta_w (max_only) or the author's bidirectional rule; default: "
            "the config's",
        },
    )
    gate_calibration_factor: float = 0.1
    gate_prune_factor: float = field(default=0.0, metadata={"help": "phi_g / theta_w; 0: no pruning"})
    gate_prune_patience: int = 3
    regrow: bool = field(
        default=False,
        metadata={
            "help": "IncrtGrowthCallback(regrow=True): a stop verdict is not final, every later check may "
            "grow the layer again (no finite stop; docs/growth_gate.md, 'A task that needs k heads')"
        },
    )


@dataclass
class RecipeArguments:
    """The recipe's settings that `TrainingArguments` has no field for."""

    _argument_group_name = "recipe (besides TrainingArguments)"

    prototype_lr_multiplier: float = field(default=10.0, metadata={"help": "prototype learning rate / lr"})
    probe_every: int = field(default=25, metadata={"help": "steps between prototype probes"})
    threads: int = field(default=DEFAULT_THREADS, metadata={"help": THREADS_HELP})


class TrainingFlags(TrainingArguments):
    """`TrainingArguments`' fields under a heading of their own, last in `--help` (parsed, never built)."""

    _argument_group_name = "training (TrainingArguments' fields; the Trainer's documentation describes them)"


def experiment_parser(*own, description: str | None = None, **defaults) -> CheckedParser:
    """The parser of a script's dataclasses `own`, the shared ones and `TrainingArguments`, with
    `TRAINING_DEFAULTS` and then `defaults` set. Its `parse_args` returns one flat namespace."""
    parser = CheckedParser(
        (*own, ModelArguments, GrowthArguments, RecipeArguments, TrainingFlags),
        description=description,
        usage="%(prog)s [--FLAG VALUE ...]",
    )
    parser.set_defaults(**{**TRAINING_DEFAULTS, **defaults})
    return parser


def check_experiment_arguments(
    parser: argparse.ArgumentParser, args: argparse.Namespace, *, epochs: bool = False
) -> None:
    """parser.error naming the flag for values the Trainer or the recipe would reject late or silently.
    `epochs`: the script trains `--num_train_epochs` when `--max_steps` <= 0."""
    if args.threads < 0:
        parser.error(f"--threads must be >= 0 (0: torch's default), got {args.threads}")
    positive = (
        "per_device_train_batch_size",
        "check_every",
        "gate_batch_size",
        "eval_steps",
        "probe_every",
        "initial_heads",
    )
    if args.max_steps < 1 and not epochs:
        parser.error(f"--max_steps must be >= 1, got {args.max_steps}")
    for name in positive:
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    for name in ("pre_growth_steps", "warmup_steps"):
        if getattr(args, name) < 0:
            parser.error(f"--{name} must be >= 0, got {getattr(args, name)}")
    if 0 < args.max_steps <= args.pre_growth_steps:
        parser.error(f"--pre_growth_steps ({args.pre_growth_steps}) must be < --max_steps ({args.max_steps})")
    for name in ("learning_rate", "prototype_lr_multiplier"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name} must be > 0, got {getattr(args, name)}")
    if args.dropout is not None and not 0 <= args.dropout < 1:
        parser.error(f"--dropout must lie in [0, 1), got {args.dropout}")


def training_arguments(args: argparse.Namespace, **overrides) -> TrainingArguments:
    """`TrainingArguments` from the namespace's fields of that name, with `overrides`."""
    return TrainingArguments(**{**{name: getattr(args, name) for name in TRAINING_FIELDS}, **overrides})


def parsed_settings(args: argparse.Namespace) -> dict:
    """The `settings` of a result file (`harness.results.write_results`): every flag but the
    `TrainingArguments` fields outside `TRAINING_DEFAULTS` left at that class's default (about a hundred;
    an absent one had its default)."""
    return {
        name: value
        for name, value in vars(args).items()
        if name not in TRAINING_FIELDS or name in TRAINING_DEFAULTS or value != TRAINING_FIELD_DEFAULTS[name]
    }


def gate_choices(args: argparse.Namespace) -> dict:
    """`--gate_threshold` / `--gate_rule` as config fields, only where given (else the config's defaults)."""
    return {
        name: getattr(args, name)
        for name in ("gate_threshold", "gate_rule")
        if getattr(args, name, None) is not None
    }


def build_model(
    args: argparse.Namespace,
    *,
    vocab_size: int,
    max_position_embeddings: int,
    num_labels: int,
    pad_token_id: int = 0,
) -> DDCLIncrtForSequenceClassification:
    """DDCL-INCRT classifier from the flags of `ModelArguments` and `GrowthArguments`, initialised from
    `args.seed`."""
    config = DDCLIncrtConfig(
        vocab_size=vocab_size,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.num_hidden_layers,
        num_heads=args.initial_heads,
        head_dim=args.head_dim,
        max_heads=args.max_heads,
        num_prototypes=args.num_prototypes,
        tau_init=args.tau_init,
        tau_min=args.tau_min,
        prototype_loss_weight=args.prototype_loss_weight,
        pooling=args.pooling,
        hidden_dropout_prob=args.dropout,
        classifier_dropout=args.dropout,
        type_vocab_size=0,
        max_position_embeddings=max_position_embeddings,
        num_labels=num_labels,
        pad_token_id=pad_token_id,
        gate_calibration_factor=args.gate_calibration_factor,
        gate_prune_factor=args.gate_prune_factor,
        gate_prune_patience=args.gate_prune_patience,
        **gate_choices(args),
    )
    set_seed(args.seed)
    return DDCLIncrtForSequenceClassification(config)
