"""DDL-mHC keeps the contract transformers' generation, pipeline and export mixins check (their files are not
in the transformers sdist, see transformers_common.py): generation from `inputs_embeds` with a static cache
and `eos_token_id=-1`, pipelines past 512 positions, `torch.export`; and the hidden-state, `logits_to_keep`
and `generate` mask contracts of a causal LM."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, pipeline

import geoformers  # noqa: F401  (registers the Auto classes)
from geoformers.models.ddl_mhc.configuration_ddl_mhc import DDLmHCConfig
from geoformers.models.ddl_mhc.llama_conversion import convert_llama_to_ddl_mhc
from geoformers.models.ddl_mhc.modeling_ddl_mhc import DDLmHCForCausalLM
from geoformers.tokenization import build_char_tokenizer

pytestmark = pytest.mark.usefixtures("single_thread")
VOCAB = 48


def small_model(seed=0, **overrides) -> DDLmHCForCausalLM:
    settings = {
        "vocab_size": VOCAB,
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 32,
        "hc_streams": 4,
        "max_position_embeddings": 64,
        "pad_token_id": 1,
        "bos_token_id": 0,
        "eos_token_id": 0,
    }
    torch.manual_seed(seed)
    return DDLmHCForCausalLM(DDLmHCConfig(**{**settings, **overrides})).eval()


def token_ids(batch, length, seed=0):
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------ hidden states


def test_hidden_states_at_one_stream_equal_llamas_gradients_included():
    torch.manual_seed(3)
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
    ).eval()
    model = convert_llama_to_ddl_mhc(llama).eval()
    ids = token_ids(2, 9)
    grads = []
    for network in (llama, model):
        hidden = network(ids, output_hidden_states=True).hidden_states
        for state in hidden:
            state.retain_grad()
        hidden[-1].square().sum().backward()
        grads.append(([state.detach() for state in hidden], [state.grad for state in hidden]))
    (llama_states, llama_grads), (states, state_grads) = grads
    assert len(states) == len(llama_states) == 4
    for got, expected in zip(states + state_grads, llama_states + llama_grads, strict=True):
        torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)
    assert all(grad.abs().sum() > 0 for grad in state_grads)


def test_hidden_states_of_many_streams_carry_the_gradient_of_a_common_stream_shift():
    """With repeated streams X = e 1^T, hidden_states[0] = e, and dL/d hidden_states[0] = sum_j dL/dX_j =
    dL/de, the gradient of the embeddings in a run without hidden states; outputs agree to rounding."""
    model = small_model()
    embeds = model.get_input_embeddings()(token_ids(2, 7)).detach()
    plain_embeds = embeds.clone().requires_grad_(True)
    plain = model(inputs_embeds=plain_embeds).logits
    plain.square().sum().backward()
    outputs = model(inputs_embeds=embeds, output_hidden_states=True)
    first = outputs.hidden_states[0]
    first.retain_grad()
    outputs.logits.square().sum().backward()
    torch.testing.assert_close(first.detach(), embeds, atol=1e-6, rtol=0)
    torch.testing.assert_close(outputs.logits, plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(first.grad, plain_embeds.grad, atol=1e-5, rtol=1e-4)


# ------------------------------------------------------------------------------------ logits_to_keep


def test_logits_to_keep_keeps_the_last_k_or_the_given_positions():
    model = small_model()
    ids = token_ids(2, 6)
    with torch.no_grad():
        full = model(ids).logits
        assert torch.equal(model(ids, logits_to_keep=0).logits, full)
        torch.testing.assert_close(model(ids, logits_to_keep=2).logits, full[:, -2:])
        torch.testing.assert_close(model(ids, logits_to_keep=torch.tensor([0, 4])).logits, full[:, [0, 4]])


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (-1, ValueError, "must be >= 0.*got -1"),
        ("a", TypeError, "got str"),
        (True, TypeError, "got bool"),
        (1.5, TypeError, "got float"),
        (torch.tensor([[1]]), TypeError, "1-D integer tensor"),
        (torch.tensor([1.0]), TypeError, "1-D integer tensor"),
    ],
)
def test_logits_to_keep_that_is_not_a_count_or_positions_is_refused(value, error, message):
    with pytest.raises(error, match=r"`logits_to_keep` .*" + message):
        small_model()(token_ids(1, 4), logits_to_keep=value)


# ------------------------------------------------------------------------------------ generation


def test_generate_from_inputs_embeds_with_a_static_cache_and_eos_minus_one_never_stops():
    """eos_token_id=-1 is transformers' "never stop": the static-cache generation from the embeddings gives
    max_new_tokens tokens, the greedy continuation of the same prompt given as ids with a dynamic cache."""
    model = small_model()
    ids = token_ids(2, 5)
    embeds = model.get_input_embeddings()(ids)
    options = {"max_new_tokens": 12, "do_sample": False, "eos_token_id": -1, "pad_token_id": 1}
    from_ids = model.generate(ids, attention_mask=torch.ones_like(ids), **options)
    from_embeds = model.generate(
        inputs_embeds=embeds, attention_mask=torch.ones_like(ids), cache_implementation="static", **options
    )
    assert from_embeds.shape == (2, 12)  # only the new tokens, all of them
    assert torch.equal(from_embeds, from_ids[:, 5:])


@pytest.mark.parametrize("length", [3, 8])
def test_generate_names_an_attention_mask_that_does_not_fit_the_prompt(length):
    model = small_model()
    ids = token_ids(1, 6)
    named = r"`attention_mask` must have shape .*\(1, 6\).*got \(1, " + str(length)
    with pytest.raises(ValueError, match=named):
        model.generate(ids, attention_mask=torch.ones(1, length, dtype=torch.long), max_new_tokens=2)


# ------------------------------------------------------------------------------------ pipelines, export


def test_pipelines_past_512_positions_match_the_model():
    """A 600-character prompt (RoPE positions past 512): the text-generation pipeline continues it as
    `generate` does, and feature extraction returns the model's last hidden state."""
    text = "".join(chr(ord("a") + (i * 7) % 26) for i in range(600))
    tokenizer = build_char_tokenizer(text + " .", model_max_length=2048)
    model = small_model(vocab_size=len(tokenizer), max_position_embeddings=1024)
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert ids.shape[1] == 600
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    continued = generator(text, max_new_tokens=4, do_sample=False, return_tensors=True)[0]
    expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False)
    assert list(continued["generated_token_ids"]) == expected[0].tolist()
    extractor = pipeline("feature-extraction", model=model.model, tokenizer=tokenizer)
    features = torch.tensor(extractor(text)[0])
    with torch.no_grad():
        torch.testing.assert_close(features, model.model(ids).last_hidden_state[0], atol=1e-5, rtol=1e-5)


def test_torch_export_gives_the_eager_logits():
    model = small_model()
    ids, mask = token_ids(2, 6), torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0
    program = torch.export.export(model, (ids,), {"attention_mask": mask, "use_cache": False})
    with torch.no_grad():
        torch.testing.assert_close(
            program.module()(ids, attention_mask=mask, use_cache=False).logits,
            model(ids, attention_mask=mask).logits,
        )
