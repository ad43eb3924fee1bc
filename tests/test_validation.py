"""The validation both configurations share (docs/reliability.md, 'Configs'): `check_number` (accepted values,
the exception type and a message naming the argument for every kind of bad value, open and closed interval
ends), and `strict_config`, huggingface_hub's `@strict` with transformers' `interval` validators, its errors
raised as the ValueError / TypeError behind them, `PreTrainedConfig`'s own fields checked without being
declared again, assignments and `update`s checked as a whole and undone when refused, and the size bound."""

import math

import pytest
from huggingface_hub.dataclasses import strict
from huggingface_hub.errors import StrictDataclassError
from transformers import PreTrainedConfig
from transformers.utils.type_validators import interval

from geoformers import DDCLIncrtConfig, DDCLIncrtForSequenceClassification, DDLmHCConfig
from geoformers.models.config_validation import check_number, strict_config


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

    width: int = interval(min=1, max=8)(default=4)
    rate: int | float = interval(min=0.0, max=1.0)(default=0.5)

    def validate_architecture(self) -> None:
        if self.width * self.rate > 3:
            raise ValueError(f"`width` * `rate` must be <= 3, got {self.width * self.rate}")


def test_strict_config_raises_the_error_behind_the_strict_one_naming_the_field():
    with pytest.raises(TypeError, match=r"^`width`: Field 'width' expected int") as caught:
        TinyConfig(width="4")
    assert not isinstance(caught.value, StrictDataclassError)
    with pytest.raises(ValueError, match=r"^`rate`: Value must be .* smaller or equal to 1.0, got 2"):
        TinyConfig(rate=2)
    with pytest.raises(ValueError, match=r"^`rate`: Value must be"):
        TinyConfig(rate=math.nan)
    with pytest.raises(ValueError, match=r"`width` \* `rate` must be <= 3"):  # a class validator
        TinyConfig(width=8, rate=1.0)


def test_an_assignment_or_update_is_checked_as_a_whole_and_undone_when_refused():
    config = TinyConfig()
    with pytest.raises(ValueError, match="`width`"):
        config.width = 9  # the field's range
    with pytest.raises(ValueError, match="must be <= 3"):
        config.width = 8  # the class validator: 8 * 0.5 > 3
    with pytest.raises(TypeError, match="`rate`"):
        config.update({"width": 6, "rate": "0.5"})  # one bad value refuses the whole update
    assert (config.width, config.rate) == (4, 0.5)
    config.update({"width": 8, "rate": 0.25})  # fields that must agree change together
    assert (config.width, config.rate) == (8, 0.25)


def test_transformers_own_fields_are_checked_without_being_declared_again():
    """`PreTrainedConfig`'s fields stay its own (the same dataclass fields); their annotations, strings that
    `@strict` skips, are checked, on construction and assignment alike."""
    for name in ("id2label", "problem_type", "dtype", "output_hidden_states"):
        assert TinyConfig.__dataclass_fields__[name] is PreTrainedConfig.__dataclass_fields__[name]
    for kwargs, error in (
        ({"problem_type": "ranking"}, TypeError),
        ({"output_hidden_states": 2}, TypeError),
        ({"id2label": {0: 5}}, TypeError),
        ({"id2label": {"a": "b"}}, TypeError),
        ({"id2label": {0: "a", 2: "b"}}, ValueError),
        ({"id2label": {}}, ValueError),
        ({"chunk_size_feed_forward": -1}, ValueError),
        ({"dtype": "float33"}, ValueError),
    ):
        (name,) = kwargs
        with pytest.raises(error, match=f"`{name}`"):
            TinyConfig(**kwargs)
        config = TinyConfig()
        with pytest.raises(error, match=f"`{name}`"):
            setattr(config, name, kwargs[name])


def test_strict_config_is_strict_underneath():
    """The class is huggingface_hub's strict dataclass: a subclass may apply `@strict` again."""

    @strict
    class Tinier(TinyConfig):
        model_type = "tinier_validation_test"

    with pytest.raises(StrictDataclassError, match="width"):
        Tinier(width=0)


def test_an_update_that_exceeds_max_heads_is_refused_before_it_can_reach_save(tmp_path):
    """`update({"num_heads": [7]})` at `max_heads` 4 used to be accepted, then fail in `save_pretrained`."""
    config = DDCLIncrtConfig(hidden_size=16, head_dim=4, num_hidden_layers=1, vocab_size=20)
    with pytest.raises(ValueError, match=r"`num_heads\[0\]` = 7 must lie in \[1, `max_heads` = 4\]"):
        config.update({"num_heads": [7]})
    with pytest.raises(ValueError, match="num_heads"):
        config.num_heads = [2, 2]  # one count per layer
    assert config.num_heads == [1]
    config.update({"num_heads": [2, 3], "num_hidden_layers": 2})
    config.save_pretrained(tmp_path)
    assert DDCLIncrtConfig.from_pretrained(tmp_path).num_heads == [2, 3]
    assert len(DDCLIncrtForSequenceClassification(config).model.layers[1].attention.heads) == 3


@pytest.mark.parametrize(
    ("config_class", "fields", "named", "elements"),
    [
        (
            DDCLIncrtConfig,
            {"num_prototypes": 2**24, "head_dim": 1024, "hidden_size": 1024},
            "`num_prototypes` x `head_dim`",
            2**34,
        ),
        (
            DDCLIncrtConfig,
            {"vocab_size": 2**24, "hidden_size": 2**9, "head_dim": 32},
            "`vocab_size` x `hidden_size`",
            2**33,
        ),
        (
            DDLmHCConfig,
            {"hc_streams": 2**10, "hidden_size": 64, "hc_chart": "sinkhorn"},
            "`hc_streams` x `hidden_size` x the chart logits",
            2**36,
        ),
    ],
)
def test_a_model_that_cannot_be_allocated_is_refused_naming_the_fields(config_class, fields, named, elements):
    """`num_prototypes=2**24` at head width 1024 (a 64 GiB prototype bank) used to fail in the allocator."""
    with pytest.raises(ValueError, match=rf"^{named} = {elements} \({elements // 2**28} GiB in float32\)"):
        config_class(**fields)
    config = config_class()
    with pytest.raises(ValueError, match=named):
        config.update(fields)
    assert config.to_dict() == config_class().to_dict()


def test_the_size_bound_leaves_large_models_that_fit():
    """2^29-element prototype banks (2 GiB) and a decoder of Llama 3 8B's shape pass."""
    DDCLIncrtConfig(num_prototypes=2**24, hidden_size=1024)
    llama_8b = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32)
    DDLmHCConfig(**llama_8b, num_attention_heads=32, num_key_value_heads=8, hc_streams=4)


def test_from_pretrained_takes_fields_that_must_agree_together(tmp_path):
    """transformers' `from_dict` assigns keyword values one by one; the constructor takes them at once."""
    DDLmHCConfig(vocab_size=50, hidden_size=32, num_attention_heads=4).save_pretrained(tmp_path)
    loaded = DDLmHCConfig.from_pretrained(
        tmp_path, hidden_size=36, num_attention_heads=6, num_key_value_heads=6
    )
    assert (loaded.hidden_size, loaded.num_attention_heads, loaded.vocab_size) == (36, 6, 50)
    with pytest.raises(ValueError, match="hidden_size"):
        DDLmHCConfig.from_pretrained(tmp_path, hidden_size=36)
