"""Config validation, one mechanism for both configurations (docs/reliability.md, 'Configs'):
huggingface_hub's `@strict`, as transformers' configs use it, with transformers' field validators (`interval`,
`activation_fn_key`) and `validate_*` methods for the fields that must agree. `strict_config` adds what
transformers' configs leave out:

- an error is the `ValueError` / `TypeError` of the failed check naming the field, no `StrictDataclassError`;
- `PreTrainedConfig`'s own fields are checked against its annotations (strings there, which `@strict` skips)
  without declaring them again; `dtype` takes what `from_pretrained` passes ("auto", a dict per sub-model);
- after construction, an assignment or `update` is also checked by the `validate_*` methods and undone when
  refused, so fields that must agree change together in one `update`;
- `validate_size`: no weight of the model has more than `MAX_TENSOR` elements and the model no more than
  `MAX_PARAMETERS` parameters, the error naming the fields whose product is too large.

`check_number` is the number check of function arguments elsewhere in the package."""

import dataclasses
import math
import sys
import typing
from functools import partial

import torch
from huggingface_hub.dataclasses import as_validated_field, strict, type_validator
from huggingface_hub.errors import (
    StrictDataclassClassValidationError,
    StrictDataclassError,
    StrictDataclassFieldValidationError,
)
from transformers import PreTrainedConfig
from transformers.utils.type_validators import interval

MAX_SIZE = 2**24  # sizes; beyond, the tables a model or its checks build take gigabytes
MAX_LAYERS = 2**14  # layers; beyond, building the per-layer modules alone takes minutes
MAX_FLOAT = sys.float_info.max  # the upper end of a range that is only required finite
# Elements of one weight: 16 GiB in float32. The largest weight of a released checkpoint (Llama 3.1 405B's
# embedding, 128256 x 16384) has half of it.
MAX_TENSOR = 2**32
MAX_PARAMETERS = 2**40  # parameters of one model: 4 TiB in float32

size = interval(min=1, max=MAX_SIZE)
layers = interval(min=1, max=MAX_LAYERS)


def check_of(validator):
    """The check inside a transformers field validator (e.g. `size`), to apply it elsewhere."""
    (check,) = validator().metadata["validator"]
    return check


def optional(validator):
    """A transformers field validator (e.g. `size`) that also lets None through."""
    check = check_of(validator)
    return as_validated_field(lambda value: None if value is None else check(value))


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
    `high`, each end open or closed; the message names `name`."""
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


def _is_dtype(value) -> bool:
    return isinstance(value, torch.dtype) or (
        isinstance(value, str) and (value == "auto" or isinstance(getattr(torch, value, None), torch.dtype))
    )


def check_dtype(dtype) -> None:
    """What transformers' `from_pretrained(dtype=...)` leaves in a config: None, "auto" (the checkpoint's own
    dtype), a torch.dtype or its name, or a dict of them per sub-model."""
    if not isinstance(dtype, (str, torch.dtype, dict, type(None))):
        raise TypeError(f"must be None, 'auto', a torch.dtype, its name or a dict of them, got {dtype!r}")
    for value in dtype.values() if isinstance(dtype, dict) else [dtype]:
        if value is not None and not _is_dtype(value):
            raise ValueError(
                f"must be None, 'auto', a torch.dtype or its name (e.g. 'float32'), or a dict of them, "
                f"got {dtype!r}"
            )


def check_label_ids(id2label) -> None:
    """transformers' `id2label`: at least one label, int ids (JSON gives digit strings) 0..n-1, each once."""
    if id2label == {}:
        raise ValueError("must name at least one label")
    for key in id2label or {}:
        if isinstance(key, str) and not (key.isascii() and key.isdigit()):
            raise TypeError(f"keys must be int label ids or their digit strings, got {key!r}")
    if id2label is not None and sorted(int(key) for key in id2label) != list(range(len(id2label))):
        raise ValueError(f"keys must be the ids 0 .. {len(id2label) - 1}, each once, got {list(id2label)}")


def check_label_names(label2id) -> None:
    """transformers' `label2id`: names to int ids or their digit strings."""
    for label, key in (label2id or {}).items():
        if isinstance(key, str) and not key.isdigit():
            raise TypeError(f"must map str names to int label ids, got {label!r}: {key!r}")


# `PreTrainedConfig`'s annotations, which name `torch` without importing it at run time
PRETRAINED_TYPES = typing.get_type_hints(PreTrainedConfig, localns={"torch": torch})
INHERITED_CHECKS = {
    field.name: [check_dtype]
    if field.name == "dtype"  # its annotation leaves out the dict `from_pretrained` may pass
    else [partial(type_validator, field.name, expected_type=PRETRAINED_TYPES[field.name])]
    for field in dataclasses.fields(PreTrainedConfig)
}
INHERITED_CHECKS["id2label"].append(check_label_ids)
INHERITED_CHECKS["label2id"].append(check_label_names)
INHERITED_CHECKS["chunk_size_feed_forward"].append(check_of(interval(min=0, max=MAX_SIZE)))


class ValidatedConfig(PreTrainedConfig):
    """What both configurations add to `PreTrainedConfig` (no field of its own): `dtype="auto"` kept as
    transformers' config loads keep it, `num_labels` checked, an assigned `id2label` normalised as at
    construction (int keys, `label2id` its inverse; None: the two default labels), special token ids inside
    the vocabulary, and `validate_size` over the config's `weight_sizes`."""

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

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """transformers' `from_dict`, with keyword values of fields (`from_pretrained(path, hidden_size=36,
        num_attention_heads=6)`) given to the constructor together instead of assigned one by one."""
        fields = {field.name for field in dataclasses.fields(cls)} - {"dtype"}  # transformers' keeps "auto"
        together = {name: kwargs.pop(name) for name in list(kwargs) if name in fields}
        return super().from_dict({**config_dict, **together}, **kwargs)

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

    def weight_sizes(self) -> dict[str, int]:
        """Element counts of the model's largest weights, each keyed by the product of fields that gives it,
        and its parameter count, keyed "parameters (...)" with the fields it grows with."""
        raise NotImplementedError

    def validate_size(self) -> None:
        """The model can be allocated: no weight above `MAX_TENSOR` elements, no model above
        `MAX_PARAMETERS` parameters."""
        for fields, elements in self.weight_sizes().items():
            bound = MAX_PARAMETERS if fields.startswith("parameters") else MAX_TENSOR
            if elements > bound:
                raise ValueError(
                    f"{fields} = {elements} ({elements / 2**28:.0f} GiB in float32) exceed the 2^"
                    f"{bound.bit_length() - 1} that a model of this config may have"
                )

    def validate_token_ids(self) -> None:
        """Every `*_token_id` (transformers' and extra ones) is None or an int in [0, vocab_size), an error
        where transformers only warns; `eos_token_id` may also be a non-empty list of them, and negative
        (generation's 'never stop')."""
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
    """huggingface_hub's `@strict` on a config class, as transformers' configs use it, with the additions in
    this module's docstring."""
    cls = strict(cls)
    for name, checks in INHERITED_CHECKS.items():
        cls.__validators__[name] = [*checks, *cls.__validators__[name]]
    strict_setattr, strict_validate = cls.__setattr__, cls.validate

    def set_field(self, name: str, value) -> None:
        try:
            strict_setattr(self, name, value)
        except StrictDataclassFieldValidationError as error:
            raise plain_error(error, f"`{name}`: ") from None

    def __setattr__(self, name: str, value) -> None:
        if name.startswith("_") or not self.__dict__.get("_post_init_done", False):
            set_field(self, name, value)  # construction ends with `validate`
        else:
            self.update({name: value})

    def update(self, config_dict: dict) -> None:
        """transformers' `update`, checked as a whole: each value by its field's checks, then the config by
        its `validate_*` methods; a refused update leaves the config as it was."""
        before = dict(self.__dict__)
        try:
            for name, value in config_dict.items():
                set_field(self, name, value)
            self.validate()
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(before)
            raise

    def validate(self) -> None:
        try:
            strict_validate(self)
        except StrictDataclassClassValidationError as error:
            raise error.__cause__ from None

    validate.__is_defined_by_strict_decorator__ = True  # a subclass may apply `@strict` again
    cls.__setattr__, cls.update, cls.validate = __setattr__, update, validate
    return cls
