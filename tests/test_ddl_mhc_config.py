"""DDLmHCConfig validation (huggingface_hub's strict dataclass validators, as transformers' configs): values
that used to be accepted and then fail at build (or give NaN later) are refused at construction naming the
field, transformers' own fields included; an assigned or updated value of the wrong type or range, or one that
breaks the fields that must agree, is refused and undone; a model too large to allocate is refused naming the
fields; eps fields accept any finite value large enough not to round to 0."""

import copy
import math
import pickle

import pytest
import torch

from geoformers import DDLmHCConfig, DDLmHCForCausalLM

SMALL = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)


def without_path(config_dict: dict) -> dict:
    return {key: value for key, value in config_dict.items() if key != "_name_or_path"}


@pytest.mark.parametrize(
    ("overrides", "error", "field"),
    [
        ({"hc_dynamic_gate_init": 1e39}, ValueError, "hc_dynamic_gate_init"),
        ({"hc_dynamic_gate_init": math.nan}, ValueError, "hc_dynamic_gate_init"),
        ({"rope_parameters": {"rope_type": "bogus"}}, ValueError, "rope_type"),
        ({"rope_parameters": [1]}, TypeError, "rope_parameters"),
        ({"rope_parameters": {"rope_type": "linear"}}, ValueError, "rope_parameters"),  # no factor
        ({"rope_parameters": {"rope_type": "linear", "factor": "x"}}, ValueError, "rope_parameters"),
        ({"rope_parameters": {"rope_type": "linear", "factor": 0.0}}, ValueError, "rope_parameters"),
        ({"rope_parameters": {"full_attention": {"rope_type": "default"}}}, ValueError, "rope_parameters"),
        ({"rope_theta": 1e-300}, ValueError, "rope_parameters"),  # inverse frequencies overflow float32
        ({"rope_theta": math.inf}, ValueError, "rope_theta"),
        ({"hidden_act": ["silu"]}, TypeError, "hidden_act"),
        ({"hidden_act": "bogus"}, ValueError, "hidden_act"),
        ({"eos_token_id": "x"}, TypeError, "eos_token_id"),
        ({"eos_token_id": [1, "x"]}, TypeError, "eos_token_id"),
        ({"eos_token_id": []}, TypeError, "eos_token_id"),
        ({"eos_token_id": 61}, ValueError, "eos_token_id"),
        ({"bos_token_id": -1}, ValueError, "bos_token_id"),
        ({"pad_token_id": True}, TypeError, "pad_token_id"),
        ({"sep_token_id": "x"}, TypeError, "sep_token_id"),  # a token id transformers stores as an extra
        ({"id2label": 5}, TypeError, "id2label"),
        ({"id2label": {"a": "b"}}, TypeError, "id2label"),
        ({"id2label": {0: 5}}, TypeError, "id2label"),
        ({"label2id": [1]}, TypeError, "label2id"),
        ({"num_labels": "x"}, TypeError, "num_labels"),
        ({"dtype": "bogus"}, ValueError, "dtype"),
        ({"problem_type": "ranking"}, TypeError, "problem_type"),
        ({"output_hidden_states": 2}, TypeError, "output_hidden_states"),
        ({"initializer_range": 1e300}, ValueError, "initializer_range"),
        ({"rms_norm_eps": 0.0}, ValueError, "rms_norm_eps"),
        ({"rms_norm_eps": 1e-40}, ValueError, "rms_norm_eps"),  # 0 in float32 under flush-to-zero
        ({"rms_norm_eps": math.inf}, ValueError, "rms_norm_eps"),
        ({"delta_eps": 1e-20}, ValueError, "delta_eps"),  # delta_eps^2 underflows float32
        ({"vocab_size": 2**40}, ValueError, "vocab_size"),
        ({"hidden_size": 10**400}, ValueError, "hidden_size"),
        ({"delta_beta_init": 10**400}, ValueError, "delta_beta_init"),
        ({"head_dim": 7}, ValueError, "head_dim"),
        # found by tests/test_fuzz_ddl_mhc.py
        ({"head_dim": None}, TypeError, "head_dim"),
        ({"pad_token_id": [0]}, TypeError, "pad_token_id"),  # only eos_token_id may list several
        ({"id2label": {0: "a", "0": "b"}}, TypeError, "id2label"),  # one key type
        ({"id2label": {0: "a", 2: "b"}}, ValueError, "id2label"),
        ({"label2id": {"a": "x"}}, TypeError, "label2id"),
        ({"num_labels": 0}, ValueError, "num_labels"),
        ({"chunk_size_feed_forward": -1}, ValueError, "chunk_size_feed_forward"),
        ({"eos_token_id": [1, None]}, TypeError, "eos_token_id"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 0.0}}, ValueError, "rope_parameters"),
        ({"num_hidden_layers": 2.5}, TypeError, "num_hidden_layers"),
        ({"num_hidden_layers": 2**40}, ValueError, "num_hidden_layers"),  # was a MemoryError
        ({"rope_parameters": {"rope_type": "linear", "factor": 0.5}}, ValueError, "factor"),
        ({"rope_parameters": {"rope_type": "linear", "factor": math.nan}}, ValueError, "factor"),
        ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, ValueError, "low_freq_factor"),
        # the size bound: weights that cannot be allocated, named by the fields whose product they are
        ({"vocab_size": 2**24, "hidden_size": 2**9}, ValueError, "`vocab_size` x `hidden_size`"),
        (
            {"hidden_size": 2**16, "intermediate_size": 2**17},
            ValueError,
            "`hidden_size` x `intermediate_size`",
        ),
        ({"num_hidden_layers": 2**14, "hidden_size": 2**13}, ValueError, "parameters"),
    ],
)
def test_rejects_at_construction_what_used_to_fail_later(overrides, error, field):
    with pytest.raises(error, match=field):
        DDLmHCConfig(**{**SMALL, **overrides})


@pytest.mark.parametrize(
    ("field", "value"), [("rms_norm_eps", 1.0), ("rms_norm_eps", 1e3), ("delta_eps", 5.0)]
)
def test_eps_fields_accept_any_finite_positive_value_and_reload(tmp_path, field, value):
    """transformers' common tests set eps to 1.0: such a config saves, reloads and runs finite."""
    config = DDLmHCConfig(**SMALL, hc_streams=2, **{field: value})
    config.save_pretrained(tmp_path)
    loaded = DDLmHCConfig.from_pretrained(tmp_path)
    assert getattr(loaded, field) == value
    assert without_path(loaded.to_dict()) == without_path(config.to_dict())
    torch.manual_seed(0)
    logits = DDLmHCForCausalLM(loaded)(torch.tensor([[1, 2, 3]])).logits
    assert torch.isfinite(logits).all()


def test_accepts_the_valid_forms_of_transformers_fields():
    config = DDLmHCConfig(
        **SMALL,
        id2label={"0": "negative", "1": "positive"},  # JSON keys are strings
        label2id={"negative": "0", "positive": "1"},  # transformers' type allows digit strings
        eos_token_id=[1, 2],
        dtype="bfloat16",
        problem_type="regression",
    )
    assert config.id2label == {0: "negative", 1: "positive"} and config.dtype == torch.bfloat16
    assert config.eos_token_id == [1, 2]


@pytest.mark.parametrize(
    ("overrides", "values"),
    [
        # the values transformers' generation accepts: -1 ("never stop"), lists of ids, None
        ({"eos_token_id": -1}, {"eos_token_id": -1}),
        ({"eos_token_id": [2, -1]}, {"eos_token_id": [2, -1]}),
        ({"eos_token_id": None, "pad_token_id": None}, {"eos_token_id": None}),
    ],
)
def test_accepts_the_eos_token_ids_generation_accepts(tmp_path, overrides, values):
    config = DDLmHCConfig(**SMALL, **overrides)
    config.save_pretrained(tmp_path)
    loaded = DDLmHCConfig.from_pretrained(tmp_path)
    assert {name: getattr(loaded, name) for name in values} == values
    config.eos_token_id = -1  # also when assigned
    config.validate()


@pytest.mark.parametrize(
    ("field", "value", "error", "named"),
    [
        ("hc_chart", "max", TypeError, "hc_chart"),
        ("num_attention_heads", [5], TypeError, "num_attention_heads"),
        ("hidden_size", 0, ValueError, "hidden_size"),
        ("eos_token_id", "x", TypeError, "eos_token_id"),
        ("id2label", 5, TypeError, "id2label"),
        ("num_labels", "x", TypeError, "num_labels"),
        ("rope_parameters", [1], TypeError, "rope_parameters"),
        ("rms_norm_eps", -1.0, ValueError, "rms_norm_eps"),
        ("use_cache", "yes", TypeError, "use_cache"),
        ("problem_type", "ranking", TypeError, "problem_type"),
        ("num_key_value_heads", None, ValueError, "num_key_value_heads"),  # None: only at construction
        ("rope_theta", 10**400, ValueError, "rope_theta"),  # beyond float range
    ],
)
def test_an_assigned_value_of_the_wrong_type_or_range_is_refused_and_not_stored(field, value, error, named):
    config = DDLmHCConfig(**SMALL, hc_streams=4, hc_chart="kromhc", pad_token_id=10)
    before = copy.deepcopy(config.to_dict())
    with pytest.raises(error, match=named):
        setattr(config, field, value)
    assert config.to_dict() == before
    DDLmHCForCausalLM(config)  # still builds


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("hidden_size", 15, "hidden_size"),
        ("hc_streams", 3, "hc_streams"),  # kromhc needs a power of two
        ("rope_parameters", {"rope_type": "bogus"}, "rope_type"),
        ("rope_theta", 1e-300, "rope_theta"),  # its inverse powers overflow float32
        ("vocab_size", 5, "pad_token_id"),  # the pad token would leave the vocabulary
        ("sep_token_id", "x", "sep_token_id"),  # an extra token id has no field validator
        ("vocab_size", 2**24, "`vocab_size` x `hidden_size`"),  # 2^36 elements at width 2^12
    ],
)
def test_an_assignment_or_update_that_breaks_agreement_is_refused_and_undone(tmp_path, field, value, named):
    config = DDLmHCConfig(**SMALL, hc_streams=4, hc_chart="kromhc", pad_token_id=10)
    if value == 2**24:  # a width at which the embedding passes 2^32 elements
        config.update({"vocab_size": 2**20, "hidden_size": 2**12, "intermediate_size": 8})
    before = copy.deepcopy(config.to_dict())
    error = TypeError if field == "sep_token_id" else ValueError
    for change in (
        lambda: setattr(config, field, value),
        lambda: config.update({field: value, "use_cache": False}),
    ):
        with pytest.raises(error, match=named):
            change()
        assert config.to_dict() == before
    config.save_pretrained(tmp_path)
    assert without_path(DDLmHCConfig.from_pretrained(tmp_path).to_dict()) == without_path(before)


def test_an_in_place_edit_is_checked_at_validate_build_and_save(tmp_path):
    """Editing `rope_parameters` in place assigns nothing: `validate()`, run at model build and at
    `save_pretrained` (transformers'), refuses it there."""
    config = DDLmHCConfig(**SMALL)
    config.rope_parameters["rope_type"] = "bogus"
    save = lambda: config.save_pretrained(tmp_path)  # noqa: E731
    for refused in (config.validate, lambda: DDLmHCForCausalLM(config), save):
        with pytest.raises(ValueError, match="rope_type"):
            refused()
    assert not (tmp_path / "config.json").exists()


def default_inverse_frequencies(theta: float, head_dim: int) -> torch.Tensor:
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def test_valid_assignments_reach_the_model_and_rope_theta_lives_in_rope_parameters():
    config = DDLmHCConfig(**SMALL)
    config.num_hidden_layers = 1
    config.rope_theta = 5e5
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 5e5}
    model = DDLmHCForCausalLM(config)
    assert len(model.model.layers) == 1
    torch.testing.assert_close(model.model.rotary_emb.inv_freq.double(), default_inverse_frequencies(5e5, 8))
    config.rope_parameters = {"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5}
    rotary = DDLmHCForCausalLM(config).model.rotary_emb
    torch.testing.assert_close(rotary.inv_freq.double(), default_inverse_frequencies(5e5, 8) / 4)
    config.rope_parameters = {"rope_type": "linear", "factor": 2.0}  # standardised as at construction
    assert config.rope_parameters == {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}
    assert config.rope_theta == 1e4 and "rope_theta" not in config.to_dict()
    legacy = {**config.to_dict(), "rope_theta": 2e4, "rope_parameters": None}  # a transformers 4 config.json
    assert DDLmHCConfig.from_dict(legacy).rope_parameters == {"rope_type": "default", "rope_theta": 2e4}


def test_fields_that_are_only_valid_together_change_together_in_one_update():
    """(32, 4 heads) -> (36, 6 heads): neither field alone is valid (36 / 4 = 9 is odd, 32 % 6 != 0)."""
    config = DDLmHCConfig(**SMALL)
    with pytest.raises(ValueError, match="hidden_size"):
        config.hidden_size = 36
    with pytest.raises(ValueError, match="num_attention_heads"):
        config.update({"num_attention_heads": 6, "num_key_value_heads": 6})
    assert (config.hidden_size, config.num_attention_heads) == (32, 4)
    config.update({"hidden_size": 36, "num_attention_heads": 6, "num_key_value_heads": 6})
    model = DDLmHCForCausalLM(config)
    assert model.model.layers[0].self_attn.q_proj.weight.shape == (36, 36)
    with pytest.raises(TypeError, match="hc_streams"):
        config.hc_streams = "2"


def test_transformers_post_construction_patterns_still_work():
    """What transformers' tests and loaders do to a built config: zero-init ranges, copies, pickles."""
    config = DDLmHCConfig(**SMALL)
    for key in list(config):  # transformers' `_config_zero_init`
        if "initializer_range" in key:
            setattr(config, key, 1e-10)
    assert config.initializer_range == 1e-10
    for clone in (copy.deepcopy(config), pickle.loads(pickle.dumps(config))):
        assert clone.to_dict() == config.to_dict()
        with pytest.raises(TypeError, match="hc_chart"):
            clone.hc_chart = "max"
    assert "_post_init_done" not in config.to_dict()


def test_assigned_label_maps_are_normalised_as_at_construction(tmp_path):
    """Assigned id2label gets int keys and a matching label2id (JSON sorts keys: mixed types would not save);
    None means the two default labels, as at construction, so the config reloads equal."""
    config = DDLmHCConfig(**SMALL)
    config.id2label = {"0": "negative", "1": "positive"}
    assert config.id2label == {0: "negative", 1: "positive"}
    assert config.label2id == {"negative": 0, "positive": 1}
    config.id2label = None
    assert config.id2label == {0: "LABEL_0", 1: "LABEL_1"}
    config.save_pretrained(tmp_path)
    assert without_path(DDLmHCConfig.from_pretrained(tmp_path).to_dict()) == without_path(config.to_dict())


def test_an_assigned_rope_dict_per_layer_type_is_refused_naming_rope_parameters():
    """transformers reads a dict keyed by layer type (here "full_attention") as one RoPE dict per layer type;
    the model has one rotary embedding for all layers (found by tests/test_fuzz_ddl_mhc.py)."""
    config = DDLmHCConfig(**SMALL)
    before = config.to_dict()
    with pytest.raises(ValueError, match="rope_parameters"):
        config.rope_parameters = {"full_attention": {"rope_type": "default"}}
    assert config.to_dict() == before
