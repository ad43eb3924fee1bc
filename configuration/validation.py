"""Checks of config fields, shared by both configurations: each raises `TypeError` for a value of the wrong
type and `ValueError` for one out of range, naming the field (docs/reliability.md)."""

import math

# transformers' `problem_type` values (as in `PreTrainedConfig`)
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")


def check_int(name: str, value, minimum: int, maximum: int | None = None) -> None:
    """An int (not a bool) in [minimum, maximum] (no upper bound when `maximum` is None)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, got {type(value).__name__} ({value!r})")
    if maximum is None and value < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {value}")
    if maximum is not None and not minimum <= value <= maximum:
        raise ValueError(f"`{name}` must lie in [{minimum}, {maximum}], got {value}")


def check_float(name: str, value, low: float, high: float = math.inf, low_open: bool = False,
                high_open: bool = False) -> None:
    """A finite number (not a bool) in the interval from `low` to `high`, each end open or closed."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"`{name}` must be a number, got {type(value).__name__} ({value!r})")
    closing = ")" if high_open or high == math.inf else "]"
    interval = f"{'(' if low_open else '['}{low}, {high}{closing}"
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"`{name}` must lie in {interval}, got {value}") from None
    too_low = number <= low if low_open else number < low
    too_high = number >= high if high_open else number > high
    if too_low or too_high or not math.isfinite(number):
        raise ValueError(f"`{name}` must be finite and lie in {interval}, got {value}")


def check_choice(name: str, value, choices: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"`{name}` must be one of {list(choices)}, got {value!r}")


def check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"`{name}` must be a bool, got {type(value).__name__} ({value!r})")
