"""The scripts' flag policy (docs/experiments.md, 'Flags'): every value is checked right after parsing,
before any model or data is loaded, and a bad one ends the script as argparse does (usage, then one line
naming its `--flag`, exit status 2).

`check_flags(args)` checks the `TrainingArguments`-named settings an args object has (a `TrainingArguments`,
a script's dataclass or a flat namespace) and `--threads`; a script adds its own with
`check_flag`. Every script parses with `CheckedParser`, which runs `check_flags` as it parses."""

import math

from transformers import HfArgumentParser

from geoformers.models.config_validation import check_number

# flag -> (low, high, high_open, integer): the ranges torch's optimizers and the Trainer's schedules accept
TRAINING_RANGES = {
    "learning_rate": (0.0, math.inf, False, False),
    "weight_decay": (0.0, math.inf, False, False),
    "adam_beta1": (0.0, 1.0, True, False),
    "adam_beta2": (0.0, 1.0, True, False),
    "adam_epsilon": (0.0, math.inf, False, False),
    "max_grad_norm": (0.0, math.inf, False, False),
    "warmup_steps": (0.0, math.inf, False, False),
    "per_device_train_batch_size": (1, math.inf, False, True),
    "per_device_eval_batch_size": (1, math.inf, False, True),
    "gradient_accumulation_steps": (1, math.inf, False, True),
    "eval_batches": (1, math.inf, False, True),
    "block_size": (2, math.inf, False, True),
    "threads": (0, math.inf, False, True),
}


def check_flag(
    flag: str, value, low=-math.inf, high=math.inf, *, low_open=False, high_open=False, integer=False
) -> None:
    """`check_number` with the message naming `--flag`."""
    check_number(f"--{flag}", value, low, high, low_open=low_open, high_open=high_open, integer=integer)


def check_flags(args) -> None:
    """Every flag of `TRAINING_RANGES` that `args` has; `--max_steps` is -1 (epochs) or >= 1."""
    for flag, (low, high, high_open, integer) in TRAINING_RANGES.items():
        if getattr(args, flag, None) is not None:
            check_flag(flag, getattr(args, flag), low, high, high_open=high_open, integer=integer)
    max_steps = getattr(args, "max_steps", None)
    if max_steps is not None and max_steps != -1:
        check_flag("max_steps", max_steps, 1, integer=True)


class CheckedParser(HfArgumentParser):
    """`HfArgumentParser` whose every parse (`parse_args`, `parse_args_into_dataclasses`, ...) runs
    `check_flags` on what it parsed, so a bad value fails before a script loads anything; the dataclasses'
    own checks and, through `checked`, a script's own exit the same way."""

    def parse_known_args(self, args=None, namespace=None):
        parsed, unknown = super().parse_known_args(args, namespace)
        self.checked(check_flags, parsed)
        return parsed, unknown

    def parse_args_into_dataclasses(self, *args, **kwargs):
        """The dataclasses' own checks (`__post_init__`, `TrainingArguments`') exit the same way."""
        return self.checked(super().parse_args_into_dataclasses, *args, **kwargs)

    def checked(self, check, *args, **kwargs):
        """`check(*args, **kwargs)`; its ValueError / TypeError becomes `self.error` (exit status 2)."""
        try:
            return check(*args, **kwargs)
        except (ValueError, TypeError) as error:
            self.error(str(error))
