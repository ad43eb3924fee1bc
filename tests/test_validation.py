"""The config field checks shared by both configurations: accepted values, the exception type and a message
naming the field for every kind of bad value, open and closed interval ends."""

import math

import pytest

from geoformers.configuration.validation import check_bool, check_choice, check_float, check_int


def test_check_int_accepts_the_bounds_and_refuses_bools_floats_and_out_of_range():
    check_int("size", 1, 1)
    check_int("size", 2**24, 1, 2**24)
    for bad in (True, 2.0, "2", None):
        with pytest.raises(TypeError, match="`size` must be an int"):
            check_int("size", bad, 1)
    with pytest.raises(ValueError, match=r"`size` must be >= 1, got 0"):
        check_int("size", 0, 1)
    with pytest.raises(ValueError, match=r"`size` must lie in \[1, 4\], got 5"):
        check_int("size", 5, 1, 4)


@pytest.mark.parametrize(
    ("value", "low_open", "high_open", "accepted"),
    [(0.0, False, False, True), (0.0, True, False, False), (1.0, False, False, True),
     (1.0, False, True, False), (0.5, True, True, True), (-1e-300, False, False, False)],
)
def test_check_float_interval_ends(value, low_open, high_open, accepted):
    if accepted:
        check_float("p", value, 0.0, 1.0, low_open, high_open)
    else:
        with pytest.raises(ValueError, match="`p` must be finite and lie in"):
            check_float("p", value, 0.0, 1.0, low_open, high_open)


def test_check_float_refuses_non_numbers_non_finite_and_huge_ints():
    with pytest.raises(TypeError, match="`eps` must be a number"):
        check_float("eps", True, low=0.0)
    with pytest.raises(TypeError, match="`eps` must be a number"):
        check_float("eps", "1e-5", low=0.0)
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match=r"`eps` must be finite and lie in \[0.0, inf\)"):
            check_float("eps", bad, low=0.0)
    with pytest.raises(ValueError, match=r"`eps` must lie in \[0.0, inf\), got 1000"):
        check_float("eps", 10**400, low=0.0)  # too large for a float: no OverflowError from inside
    check_float("eps", 3, low=0.0)  # ints are numbers


def test_check_choice_and_check_bool():
    check_choice("mode", "cls", ("cls", "mean"))
    with pytest.raises(ValueError, match=r"`mode` must be one of \['cls', 'mean'\], got 'max'"):
        check_choice("mode", "max", ("cls", "mean"))
    check_bool("flag", False)
    with pytest.raises(TypeError, match="`flag` must be a bool, got int"):
        check_bool("flag", 1)
