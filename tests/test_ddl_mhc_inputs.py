"""DDL-mHC forward arguments at the model boundary: every re-encoding of a valid input (integer widths,
mask dtypes, embedding dtypes, explicit default positions) gives the reference call's output, and every bad
one a ValueError/TypeError naming the argument; a batch with no scored token has loss 0, not NaN."""

import copy

import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from geoformers import DDLmHCConfig, DDLmHCForCausalLM
from geoformers.models.input_checks import LIST_VALUES, embeds_bound

VOCAB, HIDDEN = 61, 32
SMALL = dict(
    vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4
)


@pytest.fixture(scope="module")
def model() -> DDLmHCForCausalLM:
    """Four streams with the EC convolution, which reads the padding mask as a multiplier."""
    torch.manual_seed(0)
    lm = DDLmHCForCausalLM(DDLmHCConfig(**SMALL, hc_streams=4, stream_expansion="conv")).eval()
    with torch.no_grad():  # taps off identity, so the mask's values reach the logits
        lm.model.stream_expansion.weight.normal_(generator=torch.Generator().manual_seed(1))
    return lm


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(2))


MASK = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])


@torch.no_grad()
def logits(model, *args, **kwargs) -> torch.Tensor:
    return model(*args, **kwargs).logits


# ----------------------------------------------------------------------------------------------
# attention_mask


@pytest.mark.parametrize("dtype", (torch.bool, torch.int8, torch.int32, torch.float16, torch.float32))
def test_zero_one_masks_of_every_dtype_give_the_int64_mask_result(model, ids, dtype):
    torch.testing.assert_close(
        logits(model, ids, attention_mask=MASK.to(dtype)),
        logits(model, ids, attention_mask=MASK),
        rtol=0,
        atol=0,
    )


@pytest.mark.parametrize("value", (0.5, 2.0, -1.0, float("nan")))
def test_mask_values_other_than_zero_and_one_are_refused(model, ids, value):
    mask = MASK.float().clone()
    mask[0, 0] = value
    with pytest.raises(ValueError, match="attention_mask"):
        model(ids, attention_mask=mask)
    with pytest.raises(ValueError, match="attention_mask"):
        model(ids, attention_mask=torch.full((2, 5), 2))


@pytest.mark.parametrize(
    ("dtype", "value"), [(torch.int64, 2), (torch.int64, -1), (torch.int8, -1), (torch.uint8, 2)]
)
def test_integer_mask_values_other_than_zero_and_one_are_refused(model, ids, dtype, value):
    mask = MASK.to(dtype).clone()
    mask[1, 2] = value
    with pytest.raises(ValueError, match="attention_mask"):
        model(ids, attention_mask=mask)


@pytest.mark.parametrize("length", [5, LIST_VALUES // 2 + 1])  # read as a list; through aminmax
def test_out_of_range_ids_labels_and_mask_values_are_refused_at_any_size(model, length):
    tokens = torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(3))
    for low, high, position in ((0, VOCAB, -1), (-1, 0, 0)):
        bad = tokens.clone()
        bad[1, position] = low if low < 0 else high
        with pytest.raises(ValueError, match="input_ids"):
            model(bad)
        with pytest.raises(ValueError, match="labels"):
            model(tokens, labels=bad)
    mask = torch.ones_like(tokens)
    mask[0, -1] = 2
    with pytest.raises(ValueError, match="attention_mask"):
        model(tokens, attention_mask=mask)


@pytest.mark.parametrize(
    "mask",
    [
        torch.ones(5),
        torch.ones(2, 5, 5),
        torch.ones(2, 1, 4, 5),
        torch.ones(2, 3, 5, 5),
        torch.ones(3, 1, 5, 5),
    ],
    ids=["1d", "3d", "4d-queries", "4d-heads", "4d-batch"],
)
def test_masks_of_the_wrong_rank_or_shape_are_refused(model, ids, mask):
    with pytest.raises(ValueError, match="attention_mask"):
        model(ids, attention_mask=mask)


def causal_additive_mask(length: int) -> torch.Tensor:
    allowed = torch.ones(length, length).tril().bool()
    return torch.zeros(1, 1, length, length).masked_fill(~allowed, torch.finfo(torch.float32).min)


def test_a_prepared_4d_causal_mask_gives_the_unmasked_result(model, ids):
    """4-D masks are passed to attention as they are: an additive causal mask equals no mask, for eager and
    sdpa attention; a bool one is refused with eager attention (which adds the mask)."""
    reference = logits(model, ids)
    for implementation in ("sdpa", "eager"):
        lm = copy.deepcopy(model)
        lm.set_attn_implementation(implementation)
        torch.testing.assert_close(logits(lm, ids, attention_mask=causal_additive_mask(5)), reference)
    lm.set_attn_implementation("sdpa")
    bool_mask = torch.ones(5, 5).tril().bool()[None, None]
    torch.testing.assert_close(logits(lm, ids, attention_mask=bool_mask), reference)
    lm.set_attn_implementation("eager")
    with pytest.raises(ValueError, match="attention_mask"):
        lm(ids, attention_mask=bool_mask)
    with pytest.raises(TypeError, match="attention_mask"):
        lm(ids, attention_mask=torch.ones(1, 1, 5, 5, dtype=torch.long))
    with pytest.raises(TypeError, match="attention_mask"):
        lm(ids, attention_mask=[[1] * 5] * 2)


# ----------------------------------------------------------------------------------------------
# input_ids, inputs_embeds


@pytest.mark.parametrize("dtype", (torch.int8, torch.int16, torch.int32, torch.uint8))
def test_integer_ids_of_every_width_give_the_int64_result(model, ids, dtype):
    torch.testing.assert_close(
        logits(model, ids.to(dtype), attention_mask=MASK), logits(model, ids, attention_mask=MASK)
    )


def test_bad_ids_are_refused_naming_input_ids(model, ids):
    for bad, error in [
        (ids.bool(), TypeError),
        (ids.float(), TypeError),
        (ids.tolist(), TypeError),
        (ids[0], ValueError),
        (ids[:0], ValueError),
        (ids[:, :0], ValueError),
        (torch.full((1, 2), 255, dtype=torch.uint8), ValueError),  # out of the vocabulary
    ]:
        with pytest.raises(error, match="input_ids"):
            model(bad)


@pytest.mark.parametrize("dtype", (torch.float64, torch.bfloat16, torch.float16))
def test_embeddings_of_another_dtype_are_converted_to_the_model_dtype(model, ids, dtype):
    embeds = model.get_input_embeddings()(ids).to(dtype)
    torch.testing.assert_close(
        logits(model, inputs_embeds=embeds), logits(model, inputs_embeds=embeds.float()), rtol=0, atol=0
    )


def test_non_finite_or_overflowing_embeddings_are_refused_naming_inputs_embeds(model, ids):
    embeds = model.get_input_embeddings()(ids).detach()
    bound = embeds_bound(torch.float32, 4, HIDDEN)
    for value in (float("nan"), float("inf"), -float("inf"), 1e30, 3 * bound):
        bad = embeds.clone()
        bad[1, 2, 3] = value
        with pytest.raises(ValueError, match="inputs_embeds"):
            model(inputs_embeds=bad)
    for bad, error in [(embeds.long(), TypeError), (embeds[:, :, :8], ValueError), (embeds[:0], ValueError)]:
        with pytest.raises(error, match="inputs_embeds"):
            model(inputs_embeds=bad)


def test_embeddings_just_inside_the_bound_match_a_float64_model(model, ids):
    """The bound is where float32 stops being right: just inside it the logits still match float64's."""
    bound = embeds_bound(torch.float32, 4, HIDDEN)
    embeds = model.get_input_embeddings()(ids).detach()
    embeds = embeds / embeds.abs().amax() * (0.9 * bound)
    reference = logits(copy.deepcopy(model).double(), inputs_embeds=embeds.double())
    out = logits(model, inputs_embeds=embeds)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), reference, rtol=1e-4, atol=1e-4 * float(reference.abs().max()))


# ----------------------------------------------------------------------------------------------
# position_ids, cache


def test_explicit_default_positions_give_the_default_result(model, ids):
    positions = torch.arange(5)[None]
    reference = logits(model, ids)
    torch.testing.assert_close(logits(model, ids, position_ids=positions), reference, rtol=0, atol=0)
    torch.testing.assert_close(logits(model, ids, position_ids=positions.expand(2, 5).int()), reference)


@pytest.mark.parametrize(
    ("positions", "error"),
    [
        (torch.arange(4)[None], ValueError),
        (torch.arange(5), ValueError),
        (torch.arange(15).view(3, 5), ValueError),
        (torch.arange(5.0)[None], TypeError),
        ([list(range(5))], TypeError),
    ],
)
def test_bad_positions_are_refused(model, ids, positions, error):
    with pytest.raises(error, match="position_ids"):
        model(ids, position_ids=positions)


def test_a_cache_that_is_not_a_transformers_cache_is_refused(model, ids):
    for bad in (object(), ((torch.zeros(1), torch.zeros(1)),), {}):
        with pytest.raises(TypeError, match="cache"):
            model(ids, cache=bad, use_cache=True)
        with pytest.raises(TypeError, match="past_key_values"):  # transformers' deprecated name still works
            with pytest.warns(FutureWarning, match="past_key_values"):
                model(ids, past_key_values=bad, use_cache=True)
    model(ids, cache=DynamicCache(config=model.config), use_cache=True)


# ----------------------------------------------------------------------------------------------
# labels and the loss


def reference_loss(logits_: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(
        logits_[:, :-1].reshape(-1, VOCAB).double(), labels[:, 1:].reshape(-1), ignore_index=-100
    )


def test_loss_is_the_shifted_cross_entropy_for_every_integer_label_dtype(model, ids):
    labels = ids.clone()
    labels[0, :2] = -100
    out = model(ids, labels=labels)
    torch.testing.assert_close(out.loss.double(), reference_loss(out.logits.detach(), labels))
    for dtype in (torch.int32, torch.int16):
        torch.testing.assert_close(model(ids, labels=labels.to(dtype)).loss, out.loss, rtol=0, atol=0)


def test_a_batch_with_no_scored_token_has_loss_zero_and_zero_gradient(ids):
    torch.manual_seed(3)
    lm = DDLmHCForCausalLM(DDLmHCConfig(**SMALL, hc_streams=2))
    for inputs, labels in [(ids, torch.full_like(ids, -100)), (ids[:, :1], ids[:, :1])]:
        lm.zero_grad()
        out = lm(inputs, labels=labels)
        assert out.loss.item() == 0.0 and out.loss.grad_fn is not None
        out.loss.backward()
        assert all(p.grad is None or not p.grad.any() for p in lm.parameters())
    # gradient accumulation with no scored token in the whole accumulated batch
    assert lm(ids, labels=torch.full_like(ids, -100), num_items_in_batch=torch.tensor(0)).loss.item() == 0.0
    full = lm(ids, labels=ids, num_items_in_batch=8)  # 2 rows x 4 scored tokens: sum / 8 is the mean
    torch.testing.assert_close(full.loss.double(), reference_loss(full.logits.detach(), ids))


@pytest.mark.parametrize(
    ("labels", "error"),
    [
        (torch.full((2, 5), VOCAB), ValueError),
        (torch.full((2, 5), -2), ValueError),
        (torch.zeros(2, 5), TypeError),
        (torch.zeros(2, 5, dtype=torch.bool), TypeError),
        (torch.zeros(2, 4, dtype=torch.long), ValueError),
        ([[0] * 5] * 2, TypeError),
    ],
)
def test_bad_labels_are_refused(model, ids, labels, error):
    with pytest.raises(error, match="labels"):
        model(ids, labels=labels)


def test_labels_with_logits_to_keep_are_refused(model, ids):
    with pytest.raises(ValueError, match="logits_to_keep"):
        model(ids, labels=ids, logits_to_keep=1)


def test_value_checks_are_skipped_while_exporting(ids):
    """torch.export traces through the argument checks (their host syncs are skipped while tracing)."""
    torch.manual_seed(4)
    model = DDLmHCForCausalLM(DDLmHCConfig(**{**SMALL, "num_hidden_layers": 1}, hc_streams=2)).eval()
    kwargs = {"input_ids": ids.int(), "attention_mask": MASK.bool(), "labels": ids, "use_cache": False}
    exported = torch.export.export(model, (), kwargs).module()
    out, reference = exported(**kwargs), model(**kwargs)
    torch.testing.assert_close(out.logits, reference.logits)
    torch.testing.assert_close(out.loss, reference.loss)


def test_resized_vocabulary_is_what_the_checks_use():
    """`resize_token_embeddings` updates `config.vocab_size`, which bounds `input_ids` and `labels`."""
    torch.manual_seed(5)
    lm = DDLmHCForCausalLM(DDLmHCConfig(**SMALL, hc_streams=2))
    lm.resize_token_embeddings(VOCAB + 3)
    new_ids = torch.tensor([[1, VOCAB + 2, 3]])
    out = lm(new_ids, labels=new_ids)
    assert out.logits.shape == (1, 3, VOCAB + 3) and torch.isfinite(out.loss)
    with pytest.raises(ValueError, match="input_ids"):
        lm(torch.tensor([[VOCAB + 3]]))
