"""Config validation, one policy for both models (docs/reliability.md, 'Configs'): huggingface_hub's strict
dataclass validators, as transformers' own configs use them. A field's type (its annotation) and range
(`number`) are checked whenever it is set, at construction and on every later assignment, and an invalid value
is not stored; checks that couple fields are the config's `validate_*` methods, run at construction, at model
build and at `save_pretrained`. Errors are the `ValueError` / `TypeError` of the failed check, naming the
field. `check_number` is also the number check of function arguments elsewhere in the package."""

import math
from typing import Literal

import torch
from huggingface_hub.dataclasses import as_validated_field, strict
from huggingface_hub.errors import (
    StrictDataclassClassValidationError,
    StrictDataclassError,
    StrictDataclassFieldValidationError,
)
from transformers import PreTrainedConfig

ProblemType = Literal["regression", "single_label_classification", "multi_label_classification"]
MAX_SIZE = 2**24  # sizes; beyond, the tables a model or its checks build take gigabytes
MAX_LAYERS = 2**14  # layers; beyond, building the per-layer modules alone takes minutes


def check_number(
    name: str | None,
    value,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
) -> None:
    """`value` is an int (`integer`) or a finite real number, never a bool, in the interval from `low` to
    `high`, each end open or closed. The message names `name` (a field's check leaves that to
    `strict_config`)."""
    subject = f"`{name}` must be" if name else "must be"
    kind = "an int" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise TypeError(f"{subject} {kind}, got {type(value).__name__} ({value!r})")
    closing = ")" if high_open or high == math.inf else "]"
    interval = f"{'(' if low_open else '['}{low}, {high}{closing}"
    try:
        number = float(value)
    except OverflowError:  # an int beyond float range
        number = math.inf if value > 0 else -math.inf
    too_low = number <= low if low_open else number < low
    too_high = number >= high if high_open else number > high
    if too_low or too_high or not math.isfinite(number):
        raise ValueError(f"{subject} {'an int' if integer else 'finite'} in {interval}, got {value}")


def number(low: float = -math.inf, high: float = math.inf, *, low_open=False, high_open=False, integer=False):
    """A dataclass field checked by `check_number` whenever it is set, e.g.
    `number(1, 8, integer=True)(default=4)`.
    None passes here; the field's annotation says whether None is allowed."""

    def validator(value) -> None:
        if value is not None:
            check_number(None, value, low, high, low_open=low_open, high_open=high_open, integer=integer)

    return as_validated_field(validator)


size = number(1, MAX_SIZE, integer=True)
layers = number(1, MAX_LAYERS, integer=True)


@as_validated_field
def label_ids(id2label) -> None:
    """transformers' `id2label`: int ids (JSON gives digit strings) 0..n-1, each once, to str names."""
    if id2label is None:
        return
    if not id2label:
        raise ValueError("must name at least one label")
    for key, label in id2label.items():
        digits = isinstance(key, str) and key.isascii() and key.isdigit()
        if not (digits or (isinstance(key, int) and not isinstance(key, bool))) or not isinstance(label, str):
            raise TypeError(f"must map int label ids to str names, got {key!r}: {label!r}")
    if sorted(int(key) for key in id2label) != list(range(len(id2label))):
        raise ValueError(f"keys must be the ids 0 .. {len(id2label) - 1}, each once, got {list(id2label)}")


@as_validated_field
def label_names(label2id) -> None:
    """transformers' `label2id`: str names to int ids (or their digit strings, as its type allows)."""
    for label, key in (label2id or {}).items():
        if isinstance(key, bool) or not (isinstance(key, int) or (isinstance(key, str) and key.isdigit())):
            raise TypeError(f"must map str names to int label ids, got {label!r}: {key!r}")


def _is_dtype(value) -> bool:
    return isinstance(value, torch.dtype) or (
        isinstance(value, str) and (value == "auto" or isinstance(getattr(torch, value, None), torch.dtype))
    )


@as_validated_field
def dtype_name(dtype) -> None:
    """What transformers' `from_pretrained(dtype=...)` leaves in a config: None, "auto" (the checkpoint's own
    dtype), a torch.dtype or its name, or a dict of them per sub-model."""
    for value in dtype.values() if isinstance(dtype, dict) else [dtype]:
        if value is not None and not _is_dtype(value):
            raise ValueError(
                f"must be None, 'auto', a torch.dtype or its name (e.g. 'float32'), or a dict of them, "
                f"got {dtype!r}"
            )


class ValidatedConfig(PreTrainedConfig):
    """What both configurations add to `PreTrainedConfig`: its fields declared again with the same types as
    annotations `@strict` can read (its own are strings, which `@strict` skips), checks of the values its
    `__post_init__` would trip over with an error naming nothing (label maps, `dtype` names, `num_labels`),
    special token ids inside the vocabulary (an error, where transformers only warns), and an assigned
    `id2label` normalised as at construction (int keys, `label2id` its inverse; None: the two default
    labels)."""

    transformers_version: str | None = None
    architectures: list[str] | None = None
    output_hidden_states: bool | None = False
    return_dict: bool | None = True
    chunk_size_feed_forward: int = number(0, MAX_SIZE, integer=True)(default=0)
    is_encoder_decoder: bool = False
    problem_type: ProblemType | None = None
    id2label: dict[int, str] | dict[str, str] | None = label_ids(default=None)
    label2id: dict[str, int] | dict[str, str] | None = label_names(default=None)
    dtype: str | torch.dtype | dict[str, str | torch.dtype] | None = dtype_name(default=None)

    def __post_init__(self, **kwargs):
        if kwargs.get("num_labels") is not None:
            check_number("num_labels", kwargs["num_labels"], 1, MAX_SIZE, integer=True)
        if self.dtype is None and kwargs.get("torch_dtype") is not None:  # transformers' older name
            self.dtype = kwargs.pop("torch_dtype")
        kwargs.pop("torch_dtype", None)
        # "auto" stays "auto", as after transformers' config loads (its `__post_init__` would look it up)
        auto = self.dtype == "auto"
        if auto:
            self.dtype = None
        super().__post_init__(**kwargs)
        if auto:
            self.dtype = "auto"

    def __setattr__(self, name: str, value) -> None:
        if name == "id2label" and self.__dict__.get("_post_init_done", False):
            value = {0: "LABEL_0", 1: "LABEL_1"} if value is None else {int(k): v for k, v in value.items()}
            super().__setattr__("label2id", {label: key for key, label in value.items()})
        super().__setattr__(name, value)

    @property
    def num_labels(self) -> int | None:
        """transformers' `num_labels` (the length of `id2label`), checked when set."""
        return PreTrainedConfig.num_labels.fget(self)

    @num_labels.setter
    def num_labels(self, value: int) -> None:
        check_number("num_labels", value, 1, MAX_SIZE, integer=True)
        PreTrainedConfig.num_labels.fset(self, value)

    def validate_token_ids(self) -> None:
        """Every `*_token_id` (transformers' and extra ones) is None or an int in [0, vocab_size);
        `eos_token_id` may also be a non-empty list of them, and negative (generation's 'never stop')."""
        names = {name for name in (*vars(self), *self.__dataclass_fields__) if name.endswith("_token_id")}
        for name in sorted(names):
            value = getattr(self, name, None)
            several = name == "eos_token_id" and isinstance(value, list) and value
            for token_id in value if several else [value]:
                if token_id is None and not several:
                    continue
                if isinstance(token_id, bool) or not isinstance(token_id, int):
                    kind = "a token id" + (" or a non-empty list of them" if name == "eos_token_id" else "")
                    raise TypeError(f"`{name}` must be None or {kind}, got {value!r}")
                lowest = -math.inf if name == "eos_token_id" else 0
                if not lowest <= token_id < self.vocab_size:
                    bounds = f"in [0, `vocab_size` = {self.vocab_size})" if lowest == 0 else "< `vocab_size`"
                    raise ValueError(f"`{name}` ({value}) must be {bounds}")


def plain_error(error: StrictDataclassError, prefix: str = "") -> ValueError | TypeError:
    """The `ValueError` / `TypeError` behind a `StrictDataclassError`, its message after `prefix`."""
    cause = error.__cause__
    return (TypeError if isinstance(cause, TypeError) else ValueError)(f"{prefix}{cause}")


def strict_config(cls: type[PreTrainedConfig]) -> type[PreTrainedConfig]:
    """huggingface_hub's `@strict` on a config class, as transformers' configs use it, raising the
    `ValueError` / `TypeError` of the failed check (the field named) instead of its `StrictDataclassError`."""
    cls = strict(cls)
    strict_setattr, strict_validate = cls.__setattr__, cls.validate

    def __setattr__(self, name: str, value) -> None:
        try:
            strict_setattr(self, name, value)
        except StrictDataclassFieldValidationError as error:
            raise plain_error(error, f"`{name}`: ") from None

    def validate(self) -> None:
        try:
            strict_validate(self)
        except StrictDataclassClassValidationError as error:
            raise error.__cause__ from None

    validate.__is_defined_by_strict_decorator__ = True  # a subclass may apply `@strict` again
    cls.__setattr__, cls.validate = __setattr__, validate
    return cls
