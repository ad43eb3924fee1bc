"""Fuzzed DDLmHCConfig fields and DDLmHCForCausalLM.forward arguments (hypothesis). The property: either a
valid result (a config that saves, reloads and builds a model with finite logits; a forward equal to the
reference call with canonical arguments) or a ValueError/TypeError whose message names an offending
field/argument; never another exception, never a non-finite output for finite input.
`GEOFORMERS_FUZZ_EXAMPLES=2000 pytest tests/test_fuzz_ddl_mhc.py` runs a deeper randomised search."""

import json
import math
import os
from functools import cache

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache
from transformers.activations import ACT2FN

from geoformers import DDLmHCConfig, DDLmHCForCausalLM
from geoformers.models.input_checks import embeds_bound

BASE = dict(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2)
DEEP = int(os.environ.get("GEOFORMERS_FUZZ_EXAMPLES", "0"))  # e.g. 2000: a deeper, randomised run


def fuzz_settings(examples: int) -> settings:
    """Fixed examples by default (fast, reproducible); GEOFORMERS_FUZZ_EXAMPLES=N explores N new ones."""
    return settings(max_examples=DEEP or examples, deadline=None, derandomize=not DEEP)


SETTINGS, FORWARD_SETTINGS = fuzz_settings(40), fuzz_settings(80)

# ----------------------------------------------------------------------------------------------
# Config fields: plausible values, boundary values and wrong types, per field

any_float = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [0, 1, -1, True, "1.0", None, 10**400]
)
wrong_int = st.sampled_from([0, -1, True, 2.5, "4", None, [4], 2**40, 10**400])
small_int = st.integers(-1, 6)
flag = st.booleans() | st.sampled_from([0, 1, None, "True"])
token_id = (
    st.none()
    | st.integers(-2, 45)
    | st.lists(st.integers(-1, 42), max_size=3)
    | st.sampled_from(["x", 1.0, True, [1, "x"]])
)
label_key = st.integers(0, 3) | st.text("0123a", max_size=2)
rope = st.none() | st.sampled_from([[1], "x", {"full_attention": {"rope_type": "default"}}])
rope |= st.fixed_dictionaries(
    {"rope_type": st.sampled_from(["default", "linear", "dynamic", "llama3", "bogus", 7])},
    optional={"factor": st.floats(-2, 8) | st.sampled_from(["x", 0.0]), "rope_theta": any_float},
)

FIELDS = {
    "vocab_size": st.integers(1, 60) | wrong_int,
    "hidden_size": st.sampled_from([4, 8, 12, 16, 24]) | wrong_int,
    "intermediate_size": st.integers(1, 40) | wrong_int,
    "num_hidden_layers": st.integers(1, 2) | wrong_int,
    "num_attention_heads": st.sampled_from([1, 2, 3, 4]) | wrong_int,
    "num_key_value_heads": st.sampled_from([None, 1, 2, 4]) | wrong_int,
    "max_position_embeddings": st.integers(1, 64) | wrong_int,
    "hc_streams": small_int | wrong_int,
    "stream_conv_kernel": small_int | wrong_int,
    "head_dim": st.sampled_from([2, 4, 7, 8]) | wrong_int,
    "rms_norm_eps": st.floats(1e-30, 1e3) | any_float,
    "delta_eps": st.floats(1e-12, 10.0) | any_float,
    "initializer_range": st.floats(1e-10, 1.0) | any_float,
    "attention_dropout": st.floats(0.0, 0.99) | any_float,
    "hc_res_mix_init": st.floats(1e-6, 1 - 1e-6) | any_float,
    "hc_dynamic_gate_init": st.floats(0.0, 1e30) | any_float,
    "delta_beta_init": st.floats(1e-6, 1.999) | any_float,
    "rope_theta": st.floats(1.0, 1e7) | any_float,
    "hc_chart": st.sampled_from(["tbp", "rtbp", "sinkhorn", "mhc_lite", "kromhc", "bogus", 3]),
    "residual": st.sampled_from(["delta", "add", "mul", None]),
    "stream_expansion": st.sampled_from(["repeat", "conv", "tile", ["conv"]]),
    "hidden_act": st.sampled_from([*ACT2FN, "bogus", ["silu"], 3]),
    "hc_dynamic": flag,
    "use_cache": flag,
    "tie_word_embeddings": flag,
    "attention_bias": flag,
    "mlp_bias": flag,
    "output_hidden_states": flag,
    "pad_token_id": token_id,
    "bos_token_id": token_id,
    "eos_token_id": token_id,
    "sep_token_id": token_id,
    "id2label": st.none()
    | st.dictionaries(label_key, st.text(max_size=3) | st.integers(), max_size=3)
    | st.sampled_from([5, [1]]),
    "label2id": st.none()
    | st.dictionaries(st.text(max_size=3), st.integers() | st.text("01", max_size=1), max_size=3)
    | st.sampled_from([5, [1]]),
    "num_labels": st.integers(-1, 4) | st.sampled_from(["x", None, 2.0]),
    "dtype": st.sampled_from([None, "float32", "bfloat16", torch.float16, "bogus", 3]),
    "problem_type": st.sampled_from([None, "regression", "ranking", 1]),
    "rope_parameters": rope,
}

overrides = st.dictionaries(st.sampled_from(sorted(FIELDS)), st.none(), max_size=5).flatmap(
    lambda chosen: st.fixed_dictionaries({name: FIELDS[name] for name in chosen})
)


def assert_names_one_of(error: Exception, names) -> None:
    message = str(error)
    assert any(name in message for name in names), (
        f"{type(error).__name__}({message!r}) names none of {names}"
    )


def assert_usable(config: DDLmHCConfig) -> None:
    """Round-trips through JSON, builds, and gives finite logits and loss on in-vocabulary tokens."""
    reloaded = DDLmHCConfig.from_dict(json.loads(config.to_json_string(use_diff=False)))
    assert reloaded.to_dict() == config.to_dict()
    torch.manual_seed(0)
    model = DDLmHCForCausalLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (2, 4), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(ids, labels=ids)
    assert torch.isfinite(out.logits).all() and math.isfinite(out.loss.item())


@SETTINGS
@given(overrides)
def test_config_fields_are_valid_or_refused_naming_a_field(fields):
    try:
        config = DDLmHCConfig(**{**BASE, **fields})
    except (ValueError, TypeError) as error:
        assert_names_one_of(error, fields)
        return
    assert_usable(config)


@SETTINGS
@given(st.sampled_from(sorted(FIELDS)).flatmap(lambda name: st.tuples(st.just(name), FIELDS[name])))
def test_config_assignment_is_valid_or_refused_naming_the_field(assignment):
    """A value of the wrong type or range is refused and not stored; one that disagrees with another field
    is refused by `validate()` (run at model build and save), naming the field."""
    name, value = assignment
    config = DDLmHCConfig(**BASE, hc_streams=2)
    before = config.to_dict()
    try:
        setattr(config, name, value)
    except (ValueError, TypeError) as error:
        assert_names_one_of(error, [name])
        assert config.to_dict() == before
        return
    try:
        config.validate()
    except (ValueError, TypeError) as error:
        assert_names_one_of(error, [name])
        return
    assert_usable(config)


# ----------------------------------------------------------------------------------------------
# forward arguments: each one canonical, re-encoded (valid, same result) or corrupted (invalid)

VOCAB = 40


@cache
def fuzz_model() -> DDLmHCForCausalLM:
    torch.manual_seed(0)
    config = DDLmHCConfig(**BASE, hc_streams=4, stream_expansion="conv", stream_conv_kernel=3)
    model = DDLmHCForCausalLM(config).eval()
    with torch.no_grad():  # EC taps off identity: the padding mask reaches the logits
        model.model.stream_expansion.weight.normal_(generator=torch.Generator().manual_seed(1))
    return model


def corrupt(draw) -> bool:
    """Whether to corrupt one argument: one time in ten, so most cases are valid or have one fault."""
    return draw(st.integers(0, 9)) == 0


@st.composite
def forward_arguments(draw):
    """(arguments, canonical reference arguments, names of the invalid arguments)."""
    empty = corrupt(draw)
    batch = draw(st.sampled_from([0, 1, 2] if empty else [1, 2]))
    length = draw(st.sampled_from([0, 1, 3] if empty else [1, 2, 4]))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    ids = torch.randint(0, VOCAB, (batch, length), generator=generator)
    args, reference, invalid = {}, {}, set()

    if draw(st.booleans()):
        name, canonical = "input_ids", ids
        if corrupt(draw):
            kind = draw(st.sampled_from(["bool", "float", "list", "range"]))
        else:
            kind = draw(st.sampled_from(["int64", "int8", "int16", "int32", "uint8"]))
        value = {"bool": ids.bool(), "float": ids.float(), "list": ids.tolist()}.get(kind, ids)
        if kind in ("int8", "int16", "int32", "uint8"):
            value = ids.to(getattr(torch, kind))
        if kind == "range":
            value = ids.clone()
            if value.numel():
                value.view(-1)[0] = draw(st.sampled_from([VOCAB, -1, 10**6]))
        if kind in ("bool", "float", "list") or (kind == "range" and ids.numel()):
            invalid.add(name)
    else:
        name = "inputs_embeds"
        with torch.no_grad():
            canonical = fuzz_model().get_input_embeddings()(ids)
        if corrupt(draw):
            kind = draw(st.sampled_from(["nan", "inf", "huge", "long", "width"]))
        else:
            kind = draw(st.sampled_from(["float32", "float64", "bfloat16"]))
        value = canonical
        if kind in ("float64", "bfloat16"):
            value = canonical.to(getattr(torch, kind))
            canonical = value.float()
        elif kind in ("nan", "inf", "huge") and canonical.numel():
            value = canonical.clone()
            bad = {"nan": math.nan, "inf": -math.inf, "huge": 2 * embeds_bound(torch.float32, 4, 16)}
            value.view(-1)[0] = bad[kind]
            invalid.add(name)
        elif kind == "long":
            value = canonical.long()
            invalid.add(name)
        elif kind == "width":
            value = canonical[..., :8]
            invalid.add(name)
    if batch == 0 or length == 0:
        invalid.add(name)
    args[name], reference[name] = value, canonical

    pattern = torch.randint(0, 2, (batch, length), generator=generator)
    if corrupt(draw):
        mask_kind = draw(st.sampled_from(["half", "two", "nan", "1d", "short"]))
    else:
        mask_kind = draw(st.sampled_from(["none", "bool", "int8", "float16", "int64", "ones"]))
    if mask_kind == "ones":
        pattern = torch.ones_like(pattern)
    if mask_kind != "none":
        value = {"bool": pattern.bool(), "int8": pattern.to(torch.int8), "float16": pattern.half()}.get(
            mask_kind, pattern
        )
        if mask_kind in ("half", "two", "nan") and pattern.numel():
            value = pattern.float()
            value.view(-1)[0] = {"half": 0.5, "two": 2.0, "nan": math.nan}[mask_kind]
            invalid.add("attention_mask")
        elif mask_kind == "1d":
            value = pattern.view(-1)
            invalid.add("attention_mask")
        elif mask_kind == "short":
            value = torch.ones(batch, length + 1, dtype=torch.long)
            invalid.add("attention_mask")
        args["attention_mask"], reference["attention_mask"] = value, pattern

    positions = torch.arange(length)[None]
    if corrupt(draw):
        position_kind = draw(st.sampled_from(["float", "short"]))
        args["position_ids"] = (
            positions.float() if position_kind == "float" else torch.arange(length + 1)[None]
        )
        invalid.add("position_ids")
    else:
        position_kind = draw(st.sampled_from(["none", "default", "int32"]))
        if position_kind != "none":
            args["position_ids"] = (
                positions if position_kind == "default" else positions.int().expand(batch, -1)
            )

    label_kind = draw(
        st.sampled_from(["range", "float", "shape"])
        if corrupt(draw)
        else st.sampled_from(["none", "int64", "int32", "ignored"])
    )
    if label_kind != "none":
        labels = torch.randint(0, VOCAB, (batch, length), generator=generator)
        labels[torch.rand(batch, length, generator=generator) < 0.3] = -100
        canonical_labels = torch.full_like(labels, -100) if label_kind == "ignored" else labels
        value = {"int32": canonical_labels.int(), "float": labels.float()}.get(label_kind, canonical_labels)
        if label_kind == "range" and labels.numel():
            value = labels.clone()
            value.view(-1)[0] = draw(st.sampled_from([VOCAB, -2]))
            invalid.add("labels")
        elif label_kind == "float":
            invalid.add("labels")
        elif label_kind == "shape":
            value = torch.zeros(batch + 1, length, dtype=torch.long)
            invalid.add("labels")
        args["labels"], reference["labels"] = value, canonical_labels

    if corrupt(draw):
        args["cache"], args["use_cache"] = object(), True
        invalid.add("cache")
    elif draw(st.booleans()):
        args["cache"], args["use_cache"] = DynamicCache(config=fuzz_model().config), True
    return args, reference, invalid


@FORWARD_SETTINGS
@given(forward_arguments())
def test_forward_gives_the_reference_output_or_refuses_naming_an_argument(case):
    args, reference, invalid = case
    model = fuzz_model()
    try:
        with torch.no_grad():
            out = model(**args)
    except (ValueError, TypeError) as error:
        assert invalid, f"valid arguments refused: {error!r}"
        assert_names_one_of(error, invalid)
        return
    assert not invalid, f"invalid {invalid} accepted"
    with torch.no_grad():
        expected = model(**reference)
    assert torch.isfinite(out.logits).all()
    torch.testing.assert_close(out.logits, expected.logits)
    if "labels" in args:
        assert math.isfinite(out.loss.item())
        torch.testing.assert_close(out.loss, expected.loss)
