"""Command-line flags shared by the DDCL-INCRT experiment scripts (each script sets its own defaults with
`parser.set_defaults`) and the model they describe."""

from __future__ import annotations

import argparse

from transformers import set_seed

from geoformers.configuration.ddcl_incrt import GATE_RULES, GATE_THRESHOLDS, DDCLIncrtConfig
from geoformers.modeling.ddcl_incrt import DDCLIncrtForSequenceClassification

from harness.threads import add_threads_argument


def add_experiment_arguments(parser: argparse.ArgumentParser) -> None:
    """Model, growth and training flags shared by the experiment scripts; names follow DDCLIncrtConfig."""
    model = parser.add_argument_group("model (DDCLIncrtConfig fields)")
    model.add_argument("--hidden_size", type=int, default=64)
    model.add_argument("--num_hidden_layers", type=int, default=1)
    model.add_argument("--head_dim", type=int, default=8)
    model.add_argument("--initial_heads", type=int, default=1, help="heads per layer before growth")
    model.add_argument("--max_heads", type=int, default=None, help="default hidden // head_dim")
    model.add_argument("--num_prototypes", type=int, default=16)
    model.add_argument("--tau_init", type=float, default=1.0)
    model.add_argument("--tau_min", type=float, default=0.05)
    model.add_argument("--prototype_loss_weight", type=float, default=0.1, help="lambda in CE + lambda L_q")
    model.add_argument("--pooling", choices=("cls", "mean"), default="mean")
    model.add_argument("--dropout", type=float, default=0.0, help="hidden and classifier dropout")
    growth = parser.add_argument_group("growth (INCRT gate)")
    growth.add_argument(
        "--pre_growth_steps",
        type=int,
        default=200,
        help="steps the initial heads train before theta_w is calibrated and growth starts",
    )
    growth.add_argument(
        "--check_every",
        type=int,
        default=1,
        help="optimizer steps between gate checks (1: every growth decision is taken on "
        "nearly the same spectrum; training between checks inflates lambda_max)",
    )
    growth.add_argument("--gate_batch_size", type=int, default=64, help="training rows per gate check")
    growth.add_argument("--gate_num_tokens", type=int, default=512, help="tokens per gate check")
    growth.add_argument(
        "--gate_threshold",
        choices=GATE_THRESHOLDS,
        default=None,
        help="theta_w = factor x ||A_sym||_F at every check (relative) or calibrated once on "
        "the first checks and then fixed (calibrated, the author's rule); default: the "
        "config's (relative)",
    )
    growth.add_argument(
        "--gate_rule",
        choices=GATE_RULES,
        default=None,
        help="grow on lambda_max > theta_w (max_only) or the author's bidirectional rule "
        "(docs/growth_gate.md); default: the config's",
    )
    growth.add_argument("--gate_calibration_factor", type=float, default=0.1)
    growth.add_argument("--gate_prune_factor", type=float, default=0.0, help="phi_g / theta_w; 0: no pruning")
    growth.add_argument("--gate_prune_patience", type=int, default=3)
    training = parser.add_argument_group("training")
    training.add_argument("--max_steps", type=int, default=1000, help="optimizer steps, pre-growth included")
    training.add_argument("--batch_size", type=int, default=32)
    training.add_argument("--learning_rate", type=float, default=3e-3)
    training.add_argument("--prototype_lr_multiplier", type=float, default=10.0)
    training.add_argument("--weight_decay", type=float, default=0.01)
    training.add_argument("--warmup_steps", type=int, default=20, help="linear warm-up of the learning rate")
    training.add_argument(
        "--lr_scheduler_type",
        default="linear",
        help="schedule of the growth phase (the pre-growth phase is warm-up + constant)",
    )
    training.add_argument("--eval_steps", type=int, default=250, help="steps between evaluations")
    training.add_argument("--probe_every", type=int, default=25, help="steps between prototype probes")
    training.add_argument("--seed", type=int, default=0, help="model initialisation and data order")
    add_threads_argument(training)
    training.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="show the Trainer's progress bar (--no-progress: none)",
    )


def check_experiment_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """parser.error naming the flag for values the Trainer or the recipe would reject late or silently."""
    if args.threads < 0:
        parser.error(f"--threads must be >= 0 (0: torch's default), got {args.threads}")
    positive = ("batch_size", "check_every", "gate_batch_size", "eval_steps", "probe_every", "initial_heads")
    if args.max_steps < 1 and getattr(args, "epochs", None) is None:  # scripts with --epochs: max_steps <= 0
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
    """DDCL-INCRT classifier from the flags of `add_experiment_arguments`, initialised from `args.seed`."""
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
        gate_num_tokens=args.gate_num_tokens,
        gate_calibration_factor=args.gate_calibration_factor,
        gate_prune_factor=args.gate_prune_factor,
        gate_prune_patience=args.gate_prune_patience,
        gate_check_every=args.check_every,
        **gate_choices(args),
    )
    set_seed(args.seed)
    return DDCLIncrtForSequenceClassification(config)
