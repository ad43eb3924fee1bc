"""The SST-2 recipe of `exp_sst2.py` (docs/experiments.md, 'exp_sst2.py'): its flags, data, model and
training (the shared growth recipe with word dropout), shared with the sweeps that rerun it
(`exp_grown_vs_swept.py`)."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import Trainer

from geoformers.models.ddcl_incrt.bert_conversion import wrap_bert_embeddings
from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import DDCLIncrtConfig
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtForSequenceClassification
from geoformers.tokenization import load_bert_tokenizer, train_wordpiece
from geoformers.training.data import encode_dataset, load_sst2

from harness.data_errors import DATA_DIR_FLAG, exit_without_data
from harness.flags import check_experiment_arguments, experiment_parser, gate_choices
from harness.probes import gate_spectrum
from harness.recipe import run_growth_training
from harness.results import REPO_ROOT, default_bert_path


@dataclass
class Sst2Arguments:
    """SST-2's data, outputs, BERT variant, word dropout and ensemble."""

    _argument_group_name = "SST-2 (--dropout: default 0.5 from scratch, 0.1 with --bert)"

    data_dir: str | None = field(
        default=None,
        metadata={
            "help": "local GLUE SST-2 folder (train.tsv, dev.tsv); default: the hub's nyu-mll/glue sst2"
        },
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "train on the first rows after a seeded shuffle"}
    )
    max_eval_samples: int | None = field(default=None, metadata={"help": "default: all 872 dev sentences"})
    save_model: bool = field(default=False, metadata={"help": "also save the model and tokenizer"})
    bert: bool = field(
        default=False, metadata={"help": "DDCL-INCRT on a pre-trained BERT's frozen embeddings"}
    )
    bert_path: str | None = field(
        default=None, metadata={"help": "BERT checkpoint folder (default: the offline MiniLM)"}
    )
    use_encoder_outputs: bool = field(
        default=False, metadata={"help": "with --bert: feed its frozen encoder outputs"}
    )
    vocab_size: int = field(default=16000, metadata={"help": "WordPiece vocabulary (from scratch)"})
    max_length: int = 64
    word_dropout: float = field(
        default=0.0,
        metadata={"help": "training only: drop each non-special token with this probability (DAN)"},
    )
    no_growth: bool = field(
        default=False,
        metadata={"help": "train --initial_heads heads with no callback, in a grown run's phases"},
    )
    warmup_ratio: float = field(
        default=0.06, metadata={"help": "warm-up as a fraction of the steps unless --warmup_steps > 0"}
    )
    ensemble_size: int = field(
        default=1,
        metadata={"help": "members trained with seeds K * seed + m, m < K; their mean probabilities"},
    )
    member_processes: int = field(
        default=1,
        metadata={"help": "ensemble members trained at once, each in its own process on one thread"},
    )


def parse_args(argv: list[str] | None, description: str | None = None) -> argparse.Namespace:
    """`exp_sst2.py`'s flags: its own and the shared ones with its defaults. Training runs
    `--num_train_epochs` unless `--max_steps` > 0; `--output_dir` defaults to outputs/sst2 (outputs/sst2_bert
    with --bert; results/sst2: the committed run)."""
    parser = experiment_parser(
        Sst2Arguments,
        description=description,
        hidden_size=256,
        head_dim=32,
        prototype_loss_weight=0.01,
        dropout=None,
        check_every=10,
        gate_batch_size=256,
        gate_prune_factor=0.05,
        learning_rate=1e-3,
        per_device_train_batch_size=64,
        max_steps=-1,
        num_train_epochs=1.0,
        warmup_steps=0,
        eval_steps=200,
        train_sampling_strategy="group_by_length",
    )
    args = parser.parse_args(argv)
    check_experiment_arguments(parser, args, epochs=True)
    for name in ("max_train_samples", "max_eval_samples"):
        value = getattr(args, name)
        if value is not None and value < 2:
            parser.error(f"--{name} must be >= 2, got {value}")
    if args.ensemble_size < 1:
        parser.error(f"--ensemble_size must be >= 1, got {args.ensemble_size}")
    if args.member_processes < 1:
        parser.error(f"--member_processes must be >= 1, got {args.member_processes}")
    if args.member_processes > args.ensemble_size:
        parser.error(
            f"--member_processes ({args.member_processes}) must be <= --ensemble_size ({args.ensemble_size})"
        )
    if args.member_processes > 1 and args.threads != 1:
        parser.error(f"--member_processes > 1 runs each member on one thread; drop --threads {args.threads}")
    if not 0.0 <= args.word_dropout < 1.0:
        parser.error(f"--word_dropout must lie in [0, 1), got {args.word_dropout}")
    if args.use_encoder_outputs and not args.bert:
        parser.error("--use_encoder_outputs needs --bert")
    if args.dropout is None:
        args.dropout = 0.1 if args.bert else 0.5
    if args.output_dir is None:
        args.output_dir = str(REPO_ROOT / "outputs" / ("sst2_bert" if args.bert else "sst2"))
    return args


def load_data(args: argparse.Namespace):
    """Raw SST-2 (train subset, dev subset), the tokenizer, and the encoded splits."""
    with exit_without_data(DATA_DIR_FLAG):
        raw = load_sst2(args.data_dir)
    train, dev = raw["train"], raw["validation"]
    if args.max_train_samples is not None:
        train = train.shuffle(seed=args.seed).select(range(min(args.max_train_samples, len(train))))
    if args.max_eval_samples is not None:
        dev = dev.select(range(min(args.max_eval_samples, len(dev))))
    if args.bert:
        tokenizer = load_bert_tokenizer(
            args.bert_path or default_bert_path(), model_max_length=args.max_length
        )
    else:
        tokenizer = train_wordpiece(train["sentence"], args.vocab_size, model_max_length=args.max_length)
    encoded = [encode_dataset(split, tokenizer, max_length=args.max_length) for split in (train, dev)]
    return (train, dev), tokenizer, encoded


def build_model(args: argparse.Namespace, tokenizer) -> DDCLIncrtForSequenceClassification:
    settings = {
        "num_hidden_layers": args.num_hidden_layers,
        "num_heads": args.initial_heads,
        "head_dim": args.head_dim,
        "max_heads": args.max_heads,
        "num_prototypes": args.num_prototypes,
        "tau_init": args.tau_init,
        "tau_min": args.tau_min,
        "prototype_loss_weight": args.prototype_loss_weight,
        "pooling": args.pooling,
        "hidden_dropout_prob": args.dropout,
        "classifier_dropout": args.dropout,
        "gate_calibration_factor": args.gate_calibration_factor,
        "gate_prune_factor": args.gate_prune_factor,
        "gate_prune_patience": args.gate_prune_patience,
        **gate_choices(args),
    }
    if args.bert:
        return wrap_bert_embeddings(
            args.bert_path or default_bert_path(), use_encoder_outputs=args.use_encoder_outputs, **settings
        )
    config = DDCLIncrtConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden_size,
        max_position_embeddings=args.max_length,
        pad_token_id=tokenizer.pad_token_id,
        type_vocab_size=0,
        **settings,
    )
    return DDCLIncrtForSequenceClassification(config)


def gate_batch(dataset, collator, size: int, seed: int) -> dict:
    """`size` training rows drawn with `seed`, collated, without labels."""
    rows = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:size].sort().values
    batch = collator([dataset[int(row)] for row in rows])
    return {name: value for name, value in batch.items() if name != "labels"}


def drop_words(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    rate: float,
    special_ids: torch.Tensor,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Word dropout (DAN, Iyyer et al. 2015): every real token other than `special_ids` leaves the sentence
    with probability `rate` -> the new attention mask (dropped tokens are neither attended to nor pooled;
    [CLS]/[SEP] stay, so no row is emptied)."""
    kept = torch.rand(input_ids.shape, generator=generator, device=input_ids.device) >= rate
    kept |= torch.isin(input_ids, special_ids.to(input_ids.device))
    return attention_mask * kept.to(attention_mask.dtype)


class WordDropoutTrainer(Trainer):
    """`Trainer` whose training steps see `drop_words`; evaluation, prototype statistics and the growth
    callback's gate batches (drawn with the plain collator) see whole sentences."""

    def __init__(self, *args, word_dropout: float, special_ids: list[int], **kwargs):
        super().__init__(*args, **kwargs)
        self.word_dropout = word_dropout
        self.special_ids = torch.tensor(special_ids)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training and self.word_dropout > 0:
            inputs = {
                **inputs,
                "attention_mask": drop_words(
                    inputs["input_ids"], inputs["attention_mask"], self.word_dropout, self.special_ids
                ),
            }
        return super().compute_loss(
            model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )


def train(model, args: argparse.Namespace, train_rows, dev, collator, output_dir: Path) -> dict:
    """The shared growth recipe (`harness.recipe.run_growth_training`) over `--num_train_epochs` (or
    `--max_steps`) with `--warmup_steps` (else `--warmup_ratio`) warm-up, word dropout and evaluations every
    `--eval_steps` over the whole run (pre-growth included). `--no_growth` keeps the phases (learning-rate
    schedule, data orders) and drops the callback, so a static model differs from a grown one by its heads
    only. Returns the final evaluation, evaluations on global steps, the history on global steps (None with
    `--no_growth`), the exact A_sym spectra and theta_w when growth starts, and the training time."""
    steps_per_epoch = math.ceil(len(train_rows) / args.per_device_train_batch_size)
    total = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * steps_per_epoch)
    pre = args.pre_growth_steps
    if pre >= total:
        raise ValueError(f"--pre_growth_steps ({pre}) must be < the {total} training steps")
    warmup = args.warmup_steps if args.warmup_steps > 0 else round(args.warmup_ratio * total)
    recipe = argparse.Namespace(
        **{**vars(args), "max_steps": total, "pre_growth_steps": pre, "warmup_steps": warmup}
    )
    spectra = []

    def spectrum_at_growth_start(start: int, end: int) -> None:
        if start == pre and not args.no_growth:
            batch = gate_batch(train_rows, collator, args.gate_batch_size, args.seed)
            spectra.append(gate_spectrum(model, batch, deflated=False, num_tokens=args.gate_num_tokens))

    run = run_growth_training(
        model,
        recipe,
        train_rows,
        output_dir=output_dir,
        eval_dataset=dev,
        on_window=spectrum_at_growth_start,
        growth=not args.no_growth,
        trainer_class=WordDropoutTrainer,
        trainer_kwargs={
            "data_collator": collator,
            "word_dropout": args.word_dropout,
            "special_ids": collator.tokenizer.all_special_ids,
        },
    )
    evaluations = run.evaluations
    final = run.trainer.evaluate()
    if not evaluations or evaluations[-1]["step"] != total:
        evaluations.append({"step": total, "accuracy": final["eval_accuracy"]})
    theta_w = [float(layer.attention.gate.theta_w) for layer in model.base_model.layers]
    return {
        "final": final,
        "evaluations": evaluations,
        "history": run.history,
        "steps": total,
        "spectra_at_growth_start": spectra[0] if spectra else None,
        "theta_w": theta_w,
        "train_time_s": run.train_time_s,
    }
