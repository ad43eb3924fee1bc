"""The one builder of the DDL-mHC `Trainer` (docs/experiments.md, 'Shared causal-LM recipe'): the stock
`transformers.Trainer` with the library's optimizer groups (`geoformers.training.make_optimizer`: named
groups, chart logits at lr/6, docs/hc_diagnostics.md, 'Optimizer groups'), rows that carry their own `labels`
(`default_data_collator`, as transformers' `run_clm.py`), next-token accuracy and perplexity on evaluation.
"""

import argparse
from dataclasses import dataclass, field, replace

import torch
from transformers import Trainer, TrainingArguments, default_data_collator

from geoformers.training import make_optimizer, parameter_groups, report_callback_metrics
from geoformers.training.evaluation import causal_lm_metrics

from harness.flag_checks import CheckedParser
from harness.flags import TrainingFlags
from harness.threads import DEFAULT_THREADS, THREADS_HELP

# nanoGPT's recipe as TrainingArguments values (AdamW beta2 0.99, decay 0.1, clipping 1, linear warm-up and
# cosine decay to 0.1 x lr); the scripts set these as their flags' defaults
NANOGPT_TRAINING_DEFAULTS = {
    "learning_rate": 1e-3,
    "weight_decay": 0.1,
    "adam_beta2": 0.99,
    "max_grad_norm": 1.0,
    "warmup_steps": 100,
    "lr_scheduler_type": "cosine_with_min_lr",
    "lr_scheduler_kwargs": {"min_lr_rate": 0.1},
    "seed": 1337,
}
# the scripts' runs: the loop's (foreach) AdamW, no checkpoints or reporting unless asked, logging each step
SCRIPT_TRAINING_DEFAULTS = {
    **NANOGPT_TRAINING_DEFAULTS,
    "max_steps": 2000,
    "per_device_train_batch_size": 12,
    "optim": "adamw_torch",
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": "none",
    "disable_tqdm": True,
}


@dataclass
class LMArguments:
    """The text, its windows and the recipe's one setting `TrainingArguments` has no field for."""

    _argument_group_name = "causal-LM data and recipe (besides TrainingArguments)"

    data: str | None = field(
        default=None, metadata={"help": "local UTF-8 text file; default: the hub's karpathy/tiny_shakespeare"}
    )
    block_size: int = field(default=64, metadata={"help": "tokens per window"})
    eval_batches: int = field(default=20, metadata={"help": "validation batches per loss estimate"})
    chart_lr_multiplier: float = field(
        default=1.0,
        metadata={
            "help": "learning rate of the RTBP chart logits / lr (make_optimizer); 1: the committed runs' "
            "setting (the grouping of the earlier hand-written loop), 1/6: the library's default"
        },
    )
    threads: int = field(default=DEFAULT_THREADS, metadata={"help": THREADS_HELP})


def lm_parser(*own, description: str | None = None, **defaults) -> CheckedParser:
    """The parser of a script's dataclasses `own`, `LMArguments` and every `TrainingArguments` field, with
    `SCRIPT_TRAINING_DEFAULTS` and then `defaults` set; `parse_args` returns one flat namespace."""
    parser = CheckedParser(
        (*own, LMArguments, TrainingFlags),
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(**{**SCRIPT_TRAINING_DEFAULTS, **defaults})
    return parser


def build_lm_trainer(
    model,
    args: TrainingArguments,
    train_dataset,
    eval_dataset=None,
    *,
    tokenizer=None,
    callbacks=None,
    **lr_multipliers,
) -> Trainer:
    """`Trainer(model, args, ...)` over datasets of `input_ids` + `labels` rows, optimised by
    `make_optimizer(model, args, **lr_multipliers)`; the schedule is the Trainer's (`args.lr_scheduler_type`).
    `tokenizer` is saved with every checkpoint. `chart_lr_multiplier=1.0` gives every parameter the learning
    rate and decay of the scripts' earlier hand-written loop (AdamW grouped by tensor dimension:
    docs/experiments.md, 'Shared causal-LM recipe').

    The optimizer is handed over as a factory (`optimizer_cls_and_kwargs`), so the Trainer builds it when it
    builds its own: after FSDP has wrapped the model (the Trainer refuses a ready optimizer under FSDP).
    Metrics the callbacks log reach the `report_to` integrations (`report_callback_metrics`); without an
    accelerator the batches are not pinned (there is no device memory to pin them for)."""
    if not isinstance(args, TrainingArguments):
        raise TypeError(f"`args` must be a transformers.TrainingArguments, got {type(args).__name__}")
    parameter_groups(model, args.learning_rate, args.weight_decay, **lr_multipliers)  # bad values fail here
    if args.dataloader_pin_memory and not torch.accelerator.is_available():
        args = replace(args, dataloader_pin_memory=False)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=default_data_collator,
        processing_class=tokenizer,
        callbacks=callbacks,
        optimizer_cls_and_kwargs=(lambda: grouped_optimizer(args, lr_multipliers), {}),
        **(causal_lm_metrics() if eval_dataset is not None else {}),
    )
    return report_callback_metrics(trainer)


def grouped_optimizer(args: TrainingArguments, lr_multipliers: dict):
    """The factory `Trainer.create_optimizer` calls with the (possibly wrapped) model."""
    return lambda model: make_optimizer(model, args, **lr_multipliers)
