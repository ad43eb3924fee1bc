"""The validation both configurations share: `check_number` (accepted values, the exception type and a
message naming the argument for every kind of bad value, open and closed interval ends), and `strict_config`,
huggingface_hub's `@strict` with its errors raised as the ValueError / TypeError behind them."""

import math

import pytest
from huggingface_hub.dataclasses import strict
from huggingface_hub.errors import StrictDataclassError
from transformers import PreTrainedConfig

from geoformers.configuration.validation import check_number, number, strict_config


def test_check_number_integer_accepts_the_bounds_and_refuses_bools_floats_and_out_of_range():
    check_number("size", 1, 1, integer=True)
    check_number("size", 2**24, 1, 2**24, integer=True)
    for bad in (True, 2.0, "2", None):
        with pytest.raises(TypeError, match="`size` must be an int"):
            check_number("size", bad, 1, integer=True)
    with pytest.raises(ValueError, match=r"`size` must be an int in \[1, inf\), got 0"):
        check_number("size", 0, 1, integer=True)
    with pytest.raises(ValueError, match=r"`size` must be an int in \[1, 4\], got 5"):
        check_number("size", 5, 1, 4, integer=True)
    with pytest.raises(ValueError, match="`size` must be an int in"):
        check_number("size", 10**400, 1, integer=True)  # beyond float range: no OverflowError from inside


@pytest.mark.parametrize(
    ("value", "low_open", "high_open", "accepted"),
    [
        (0.0, False, False, True),
        (0.0, True, False, False),
        (1.0, False, False, True),
        (1.0, False, True, False),
        (0.5, True, True, True),
        (-1e-300, False, False, False),
    ],
)
def test_check_number_interval_ends(value, low_open, high_open, accepted):
    if accepted:
        check_number("p", value, 0.0, 1.0, low_open=low_open, high_open=high_open)
    else:
        with pytest.raises(ValueError, match="`p` must be finite in"):
            check_number("p", value, 0.0, 1.0, low_open=low_open, high_open=high_open)


def test_check_number_refuses_non_numbers_non_finite_and_huge_ints():
    with pytest.raises(TypeError, match="`eps` must be a number"):
        check_number("eps", True, 0.0)
    with pytest.raises(TypeError, match="`eps` must be a number"):
        check_number("eps", "1e-5", 0.0)
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match=r"`eps` must be finite in \[0.0, inf\)"):
            check_number("eps", bad, 0.0)
    with pytest.raises(ValueError, match=r"`eps` must be finite in \[0.0, inf\), got 1000"):
        check_number("eps", 10**400, 0.0)
    check_number("eps", 3, 0.0)  # ints are numbers


@strict_config
class TinyConfig(PreTrainedConfig):
    model_type = "tiny_validation_test"

    width: int = number(1, 8, integer=True)(default=4)
    rate: int | float = number(0.0, 1.0)(default=0.5)

    def validate_architecture(self) -> None:
        if self.width * self.rate > 3:
            raise ValueError(f"`width` * `rate` must be <= 3, got {self.width * self.rate}")


def test_strict_config_raises_the_error_behind_the_strict_one_naming_the_field():
    with pytest.raises(TypeError, match=r"^`width`: Field 'width' expected int") as caught:
        TinyConfig(width="4")
    assert not isinstance(caught.value, StrictDataclassError)
    with pytest.raises(ValueError, match=r"^`rate`: must be finite in \[0.0, 1.0\], got 2"):
        TinyConfig(rate=2)
    with pytest.raises(ValueError, match=r"`width` \* `rate` must be <= 3"):  # a class validator
        TinyConfig(width=8, rate=1.0)
    config = TinyConfig()
    with pytest.raises(ValueError, match="`width`"):
        config.width = 9
    assert config.width == 4  # refused before it is stored
    config.width = 8  # fields that must agree change one at a time; `validate` checks them together
    with pytest.raises(ValueError, match="must be <= 3"):
        config.validate()


def test_strict_config_is_strict_underneath():
    """The class is huggingface_hub's strict dataclass: a subclass may apply `@strict` again."""

    @strict
    class Tinier(TinyConfig):
        model_type = "tinier_validation_test"

    with pytest.raises(StrictDataclassError, match="width"):
        Tinier(width=0)
