"""DDCL-INCRT at its boundary: a user's mistake in the inputs, the labels or the config is a ValueError /
TypeError naming the argument (never an error from inside torch, never non-finite output), fuzzed with
hypothesis; the INCRT gate refuses checks that would make its state non-finite."""

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import geoformers  # noqa: F401  (registers the Auto classes)
from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import DDCLIncrtConfig
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtForSequenceClassification

VOCAB, HIDDEN, HEAD_DIM, MAX_LENGTH, LABELS = 40, 16, 4, 12, 3
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def small_config(**overrides):
    settings_ = {
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": 2,
        "num_heads": [1, 2],
        "num_prototypes": 3,
        "max_position_embeddings": MAX_LENGTH,
        "num_labels": LABELS,
    }
    settings_.update(overrides)
    return DDCLIncrtConfig(**settings_)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return DDCLIncrtForSequenceClassification(small_config()).eval()


def ids(batch=2, length=5, seed=0):
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------------------------- inputs


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.uint8])
def test_integer_input_ids_of_any_width_are_converted(model, dtype):
    reference = model(ids(), attention_mask=torch.ones(2, 5, dtype=torch.long)).logits
    converted = model(ids().to(dtype), attention_mask=torch.ones(2, 5, dtype=dtype)).logits
    torch.testing.assert_close(converted, reference, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("kwargs", "message", "error"),
    [
        ({"input_ids": ids().tolist()}, "`input_ids` must be a torch.Tensor, got list", TypeError),
        ({"input_ids": ids().numpy()}, "`input_ids` must be a torch.Tensor, got ndarray", TypeError),
        ({"input_ids": ids() > 5}, "`input_ids` must be an integer tensor, got torch.bool", TypeError),
        (
            {"input_ids": ids(), "attention_mask": [[1] * 5] * 2},
            "`attention_mask` must be a torch.Tensor",
            TypeError,
        ),
        (
            {"input_ids": ids(), "token_type_ids": np.zeros((2, 5))},
            "`token_type_ids` must be a torch.Tensor",
            TypeError,
        ),
        (
            {"input_ids": ids(), "token_type_ids": torch.zeros(2, 5)},
            "`token_type_ids` must be an integer",
            TypeError,
        ),
        ({"input_ids": ids(batch=0)}, "`input_ids` has batch size 0", ValueError),
        ({"input_ids": ids(length=0)}, "`input_ids` has sequence length 0", ValueError),
        ({"inputs_embeds": torch.zeros(0, 4, HIDDEN)}, "`inputs_embeds` has batch size 0", ValueError),
        (
            {"inputs_embeds": torch.zeros(1, 4, HIDDEN, dtype=torch.float64)},
            "`inputs_embeds` must have the model's dtype torch.float32",
            TypeError,
        ),
        ({"inputs_embeds": torch.zeros(1, 4, HIDDEN, dtype=torch.long)}, "`inputs_embeds`", TypeError),
        (
            {"inputs_embeds": torch.full((1, 4, HIDDEN), math.nan)},
            "`inputs_embeds` must be finite",
            ValueError,
        ),
        (
            {"inputs_embeds": torch.full((1, 4, HIDDEN), -math.inf)},
            "`inputs_embeds` must be finite",
            ValueError,
        ),
        ({"inputs_embeds": 1e30 * torch.randn(1, 4, HIDDEN)}, "`inputs_embeds` are too large", ValueError),
        (
            {"input_ids": ids(), "attention_mask": torch.tensor([[1, 1, 1, 0.5, 0]] * 2)},
            "`attention_mask`",
            ValueError,
        ),
        (
            {"input_ids": ids(), "attention_mask": torch.tensor([[1, 1, 1, math.nan, 0]] * 2)},
            "`attention_mask`",
            ValueError,
        ),
        ({"input_ids": ids(), "attention_mask": torch.ones(5)}, "`attention_mask`", ValueError),
        ({"input_ids": ids(), "labels": torch.zeros(0, dtype=torch.long)}, "`labels`", ValueError),
        ({"input_ids": ids(), "labels": torch.tensor([0, LABELS])}, "`labels`", ValueError),
    ],
)
def test_bad_inputs_name_the_argument(model, kwargs, message, error):
    with pytest.raises(error, match=re.escape(message)):
        model(**kwargs)


def test_large_but_harmless_inputs_embeds_give_finite_logits(model):
    embeds = 1e15 * torch.randn(2, 5, HIDDEN, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(model(inputs_embeds=embeds).logits).all()


# --------------------------------------------------------------------------------------------- gate state


HUGE_MOMENT = torch.diag(torch.linspace(1e30, 2e30, HIDDEN))  # finite in float32; A_res A_res is not


def gate_state(model):
    return {name: tensor.clone() for name, tensor in model.state_dict().items() if ".gate." in name}


def assert_unchanged(before, model):
    after = gate_state(model)
    assert before.keys() == after.keys()
    for name, value in before.items():
        assert torch.equal(after[name], value), name


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m.gate_check(ids(batch=0)), "`input_ids` has batch size 0"),
        (lambda m: m.gate_check(ids(), attention_mask=torch.zeros(2, 5)), "attention_mask"),
        (
            lambda m: m.gate_check(
                second_moments=[torch.eye(HIDDEN), torch.full((HIDDEN, HIDDEN), math.nan)]
            ),
            "`second_moments` must be finite",
        ),
        (lambda m: m.gate_check(second_moments=[torch.eye(HIDDEN), HUGE_MOMENT]), "overflow"),
        (lambda m: m.gate_check(ids(), num_tokens=1), "`num_tokens` must be an int in [2, "),
        (lambda m: m.gate_check(ids(), tracker_steps=0), "`tracker_steps` must be an int in [1, "),
    ],
)
def test_gate_check_refuses_empty_or_non_finite_batches_and_keeps_its_state(call, message):
    torch.manual_seed(0)
    model = DDCLIncrtForSequenceClassification(small_config()).eval()
    model.gate_check(ids())
    before = gate_state(model)
    with pytest.raises(ValueError, match=re.escape(message)):
        call(model)
    assert_unchanged(before, model)
    assert all(torch.isfinite(value.float()).all() for value in before.values())


def test_gate_second_moments_of_a_fully_padded_batch_are_refused_when_values_are_not_checked(monkeypatch):
    """Off CPU the forward does not read the mask; the gate still refuses a batch without real tokens."""
    import geoformers.models.ddcl_incrt.modeling_ddcl_incrt as modeling

    torch.manual_seed(0)
    model = DDCLIncrtForSequenceClassification(small_config(pooling="mean")).eval()
    before = gate_state(model)
    monkeypatch.setattr(modeling, "_checks_values", lambda tensor: False)
    with pytest.raises(ValueError, match="at least one real token"):
        model.gate_check(ids(), attention_mask=torch.zeros(2, 5))
    assert_unchanged(before, model)


# --------------------------------------------------------------------------------------------- fuzz: forward


def mutate_input_ids(draw, kwargs):
    choice = draw(st.sampled_from(["dtype", "value", "shape", "container"]))
    input_ids = kwargs["input_ids"]
    if choice == "dtype":
        dtype = draw(
            st.sampled_from(
                [torch.int8, torch.int16, torch.int32, torch.uint8, torch.bool, torch.float32, torch.float64]
            )
        )
        kwargs["input_ids"] = input_ids.to(dtype)
    elif choice == "value":
        value = draw(st.sampled_from([-1, VOCAB, VOCAB + 7, 2**40]))
        row = draw(st.integers(0, input_ids.shape[0] - 1))
        column = draw(st.integers(0, input_ids.shape[1] - 1))
        input_ids = input_ids.clone()
        input_ids[row, column] = value
        kwargs["input_ids"] = input_ids
    elif choice == "shape":
        kwargs["input_ids"] = draw(
            st.sampled_from(
                [
                    input_ids[0],
                    input_ids[None],
                    input_ids[:0],
                    input_ids[:, :0],
                    torch.ones(input_ids.shape[0], MAX_LENGTH + 1, dtype=torch.long),
                ]
            )
        )
    else:
        kwargs["input_ids"] = draw(st.sampled_from([input_ids.tolist(), input_ids.numpy()]))


def mutate_attention_mask(draw, kwargs):
    mask = kwargs["attention_mask"].clone().float()
    choice = draw(st.sampled_from(["value", "dtype", "shape", "empty_row", "first_padding"]))
    if choice == "value":
        row, column = draw(st.integers(0, mask.shape[0] - 1)), draw(st.integers(0, mask.shape[1] - 1))
        mask[row, column] = draw(st.sampled_from([0.5, 2.0, -1.0, math.nan, math.inf]))
    elif choice == "dtype":
        mask = mask.to(draw(st.sampled_from([torch.bool, torch.int8, torch.float16, torch.complex64])))
    elif choice == "shape":
        mask = draw(st.sampled_from([mask[0], mask[:, :-1], mask[None], mask[:, None, None, :]]))
    elif choice == "empty_row":
        mask[draw(st.integers(0, mask.shape[0] - 1))] = 0
    else:
        mask[:, 0] = 0
    kwargs["attention_mask"] = mask


def mutate_token_type_ids(draw, kwargs):
    shape = kwargs["input_ids"].shape
    kwargs["token_type_ids"] = draw(
        st.sampled_from(
            [
                torch.zeros(shape, dtype=torch.long),
                torch.ones(shape, dtype=torch.int8),
                torch.full(shape, 2),
                torch.full(shape, -1),
                torch.zeros(shape),
                torch.zeros(shape[0], shape[1] + 1, dtype=torch.long),
            ]
        )
    )


def mutate_inputs_embeds(draw, kwargs, model):
    embeds = model.get_input_embeddings()(kwargs.pop("input_ids")).detach().clone()
    choice = draw(st.sampled_from(["value", "dtype", "shape"]))
    if choice == "value":
        row, column = draw(st.integers(0, embeds.shape[0] - 1)), draw(st.integers(0, embeds.shape[1] - 1))
        embeds[row, column] = draw(st.sampled_from([math.nan, math.inf, -math.inf, 1e30, -1e30, 1e3]))
    elif choice == "dtype":
        embeds = embeds.to(draw(st.sampled_from([torch.float64, torch.float16, torch.bfloat16, torch.long])))
    else:
        embeds = draw(st.sampled_from([embeds[0], embeds[..., :-1], embeds[:0]]))
    kwargs["inputs_embeds"] = embeds


def mutate_labels(draw, kwargs):
    batch = kwargs["input_ids"].shape[0]
    kwargs["labels"] = draw(
        st.sampled_from(
            [
                torch.zeros(batch, dtype=torch.long),
                torch.full((batch,), -100),
                torch.full((batch,), LABELS),
                torch.full((batch,), -1),
                torch.zeros(batch),
                torch.zeros(0, dtype=torch.long),
                torch.zeros(batch, LABELS, dtype=torch.long),
                torch.ones(batch, dtype=torch.int8),
                [0] * batch,
            ]
        )
    )


@st.composite
def forward_case(draw, model):
    batch, length = draw(st.integers(1, 3)), draw(st.integers(1, MAX_LENGTH))
    lengths = [length] + [draw(st.integers(1, length)) for _ in range(batch - 1)]
    input_ids = ids(batch, length, seed=draw(st.integers(0, 2**16)))
    attention_mask = (torch.arange(length)[None] < torch.tensor(lengths)[:, None]).long()
    kwargs = {"input_ids": input_ids * attention_mask, "attention_mask": attention_mask}
    target = draw(
        st.sampled_from([None, "input_ids", "attention_mask", "token_type_ids", "inputs_embeds", "labels"])
    )
    if target == "inputs_embeds":
        mutate_inputs_embeds(draw, kwargs, model)
    elif target is not None:
        {
            "input_ids": mutate_input_ids,
            "attention_mask": mutate_attention_mask,
            "token_type_ids": mutate_token_type_ids,
            "labels": mutate_labels,
        }[target](draw, kwargs)
    return kwargs, target


def canonical(kwargs):
    """The same inputs as int64 tensors (what the model must treat them as when it accepts them)."""
    result = dict(kwargs)
    for name in ("input_ids", "token_type_ids", "labels"):
        if name in result:
            result[name] = torch.as_tensor(np.asarray(result[name])).long()
    if "attention_mask" in result:
        result["attention_mask"] = result["attention_mask"].long()
    return result


@FUZZ
@given(data=st.data())
def test_fuzzed_forward_inputs_give_the_reference_output_or_name_the_argument(model, data):
    kwargs, target = data.draw(forward_case(model))
    try:
        output = model(**kwargs)
    except (ValueError, TypeError) as error:
        assert target is not None, f"valid inputs refused: {error}"
        assert f"`{target}`" in str(error), (target, str(error))
        return
    assert torch.isfinite(output.logits).all()
    assert output.loss is None or torch.isfinite(output.loss)
    reference = model(**canonical(kwargs))
    torch.testing.assert_close(output.logits, reference.logits, rtol=0, atol=0)


# --------------------------------------------------------------------------------------------- fuzz: config

# A field's value can make a field it is checked against the one at fault (tau_init > tau_min, ...).
COUPLED = {
    "hidden_size": {"head_dim", "max_heads"},
    "head_dim": {"hidden_size", "max_heads"},
    "num_hidden_layers": {"num_heads"},
    "max_heads": {"num_heads"},
    "tau_min": {"tau_init"},
    "vocab_size": {"pad_token_id", "eos_token_id"},
    "gate_threshold": {"gate_theta_w"},
    "num_labels": {"problem_type"},
    "problem_type": {"num_labels"},
    "num_attention_heads": {"num_heads"},
}
ODD_VALUES = st.sampled_from(
    [
        None,
        True,
        "3",
        [1],
        {"a": 1},
        math.nan,
        math.inf,
        -math.inf,
        1e300,
        -1e300,
        1e-300,
        0,
        -1,
        0.5,
        1.0,
        2.0,
    ]
)
SMALL_INTS = st.integers(-2, 16)
FIELDS = {
    "vocab_size": SMALL_INTS,
    "hidden_size": SMALL_INTS,
    "num_hidden_layers": st.integers(-1, 3),
    "head_dim": SMALL_INTS,
    "max_heads": SMALL_INTS,
    "num_prototypes": SMALL_INTS,
    "max_position_embeddings": SMALL_INTS,
    "type_vocab_size": st.integers(-1, 3),
    "num_heads": st.one_of(SMALL_INTS, st.lists(st.integers(-1, 6), max_size=3)),
    "num_attention_heads": st.integers(-1, 6),
    "num_labels": st.integers(-1, 4),
    "tau_init": st.floats(allow_nan=True, allow_infinity=True),
    "tau_min": st.floats(allow_nan=True),
    "prototype_loss_weight": st.floats(-2, 1e6),
    "layer_norm_eps": st.floats(allow_nan=True),
    "initializer_range": st.floats(allow_nan=True, allow_infinity=True),
    "hidden_dropout_prob": st.floats(-1, 2),
    "classifier_dropout": st.floats(-1, 2),
    "pooling": st.sampled_from(["cls", "mean", "max", "", "CLS"]),
    "gate_threshold": st.sampled_from(["calibrated", "relative", "fixed"]),
    "gate_theta_w": st.one_of(st.none(), st.floats(allow_nan=True)),
    "gate_oja_step": st.floats(-1, 2),
    "pad_token_id": st.one_of(st.none(), SMALL_INTS),
    "eos_token_id": st.one_of(SMALL_INTS, st.lists(SMALL_INTS, max_size=2)),
    "problem_type": st.sampled_from(
        [None, "regression", "single_label_classification", "multi_label_classification", "ranking"]
    ),
    "id2label": st.one_of(
        st.dictionaries(st.integers(-1, 3), st.text(max_size=3), max_size=3),
        st.dictionaries(st.text(max_size=2), st.integers(0, 3), max_size=2),
    ),
    "output_hidden_states": st.one_of(st.booleans(), st.none(), st.integers(0, 2)),
}


def base_settings():
    return {
        "vocab_size": 12,
        "hidden_size": 8,
        "head_dim": 4,
        "num_hidden_layers": 2,
        "num_prototypes": 3,
        "max_position_embeddings": 8,
        "pad_token_id": 0,
    }


def labels_for(config, batch):
    problem_type = config.problem_type
    if problem_type == "regression" or (problem_type is None and config.num_labels == 1):
        return torch.linspace(-1, 1, batch * config.num_labels).reshape(batch, config.num_labels)
    if problem_type == "multi_label_classification":
        return (torch.arange(batch * config.num_labels).reshape(batch, config.num_labels) % 2).float()
    return torch.arange(batch) % config.num_labels


@FUZZ
@given(
    overrides=st.dictionaries(st.sampled_from(sorted(FIELDS)), st.just(None), min_size=1, max_size=3).flatmap(
        lambda chosen: st.fixed_dictionaries({name: st.one_of(FIELDS[name], ODD_VALUES) for name in chosen})
    )
)
def test_fuzzed_configs_build_a_finite_model_or_name_the_field(tmp_path_factory, overrides):
    settings_ = {**base_settings(), **overrides}
    try:
        config = DDCLIncrtConfig(**settings_)
    except (ValueError, TypeError) as error:
        named = set(re.findall(r"`([a-z_0-9]+)", str(error)))  # `name`, `name[i]`, `name=value`
        allowed = set(overrides).union(*(COUPLED.get(name, set()) for name in overrides))
        assert named & allowed, (overrides, str(error))
        return
    torch.manual_seed(0)
    model = DDCLIncrtForSequenceClassification(config).train()
    length = min(4, config.max_position_embeddings)
    input_ids = torch.arange(2 * length).reshape(2, length) % config.vocab_size
    output = model(input_ids, labels=labels_for(config, 2))
    assert torch.isfinite(output.logits).all() and torch.isfinite(output.loss)
    output.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    folder = tmp_path_factory.mktemp("config")
    config.save_pretrained(folder)
    reloaded = DDCLIncrtConfig.from_pretrained(folder)
    assert reloaded.to_dict() == config.to_dict()
