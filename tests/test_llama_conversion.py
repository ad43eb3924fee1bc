"""Llama -> DDL-mHC upcycling (docs/upcycling.md): with `residual="add"` the converted model computes Llama's
logits for any number of streams, on a random and on a trained Llama; the delta update approaches them as
O(||h||^2 / eps^2); the converted point trains."""

import pytest
import torch
from conftest import SHARED_DATA
from script_modules import load_script
from test_ddl_mhc import llama_reference
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    get_cosine_with_min_lr_schedule_with_warmup,
)

from geoformers import DDLmHCConfig, DDLmHCForCausalLM, convert_llama_to_ddl_mhc
from geoformers.models.ddl_mhc.llama_conversion import LAYER_READ_WEIGHT, SYMMETRY_BREAKING
from geoformers.models.ddl_mhc.modeling_ddl_mhc import HyperConnection
from geoformers.models.ddl_mhc.ops.dispatch import ops_path
from geoformers.tokenization import build_char_tokenizer
from geoformers.training import parameter_groups

from harness.random_windows import get_batch

pytestmark = pytest.mark.usefixtures("single_thread")

VOCAB = 50
STREAMS = [1, 2, 4, 8]


def random_llama() -> LlamaForCausalLM:
    """3 layers, grouped key/value heads, norm gains away from 1 (a dropped or swapped norm would show)."""
    return llama_reference(tie=False, vocab_size=VOCAB)


def adamw_steps(model, lr: float, steps: int) -> None:
    """`steps` AdamW steps on random batches (seed 1), each applying the gradient already accumulated, then
    computing the next one."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        optimizer.step()
        optimizer.zero_grad()
        batch = torch.randint(0, VOCAB, (4, 16), generator=generator)
        model(input_ids=batch, labels=batch).loss.backward()


@pytest.fixture(scope="module")
def trained_llama() -> LlamaForCausalLM:
    """A width-32 Llama trained 300 AdamW steps on character-level tiny-shakespeare (a few seconds): trained
    weights have larger sublayer outputs and less symmetric activations than an initialisation."""
    path = SHARED_DATA / "tinyshakespeare" / "input.txt"
    if not path.is_file():
        pytest.skip(f"tiny-shakespeare ({path}) is absent: the trained-Llama tests need the real data folder")
    text = path.read_text(encoding="utf-8")[:100_000]
    tokenizer = build_char_tokenizer(text)
    ids = torch.tensor(tokenizer.encode(text, add_special_tokens=False, verbose=False))
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    llama = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(llama.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(300):
        starts = torch.randint(len(ids) - 32, (8,), generator=generator).tolist()
        batch = torch.stack([ids[start : start + 32] for start in starts])
        loss = llama(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert sum(losses[-20:]) / 20 < losses[0] - 1.0  # it learned: ln(vocab) ~ 4 -> ~2.5 nats / char
    return llama.eval()


def llama_for(kind: str, request) -> LlamaForCausalLM:
    return random_llama() if kind == "random" else request.getfixturevalue("trained_llama")


def token_ids(llama: LlamaForCausalLM, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, llama.config.vocab_size, (batch, length), generator=generator)


def padded_inputs(llama: LlamaForCausalLM) -> dict:
    ids = token_ids(llama, 3, 12)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    return {"input_ids": ids, "attention_mask": mask}


# ----------------------------------------------------------------------------------------------
# "add": exact for any n


@pytest.mark.parametrize("kind", ["random", "trained"])
@pytest.mark.parametrize("path", ["node", "naive"])
@pytest.mark.parametrize("dynamic", [True, False])
@pytest.mark.parametrize("n", STREAMS)
def test_add_conversion_has_llamas_logits(n, dynamic, path, kind, request):
    llama = llama_for(kind, request)
    model = convert_llama_to_ddl_mhc(llama, hc_streams=n, residual="add", hc_dynamic=dynamic).eval()
    inputs = padded_inputs(llama)
    with torch.no_grad():
        expected = llama(**inputs).logits
        with ops_path(path):
            got = model(**inputs).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    if n > 1:  # not vacuous: the maps are not the identity
        connection = model.model.layers[0].attn_connection
        weights = torch.softmax(connection.pre_bias, -1)
        assert weights.max() - weights.min() > 0.05
        if dynamic:
            assert connection.maps_proj.weight[:n].abs().max() > 0  # dynamic read rows are kept


@pytest.mark.parametrize(
    "overrides",
    [
        {"hc_chart": "tbp"},
        {"hc_chart": "sinkhorn"},
        {"hc_chart": "mhc_lite"},
        {"hc_chart": "kromhc"},
        {"stream_expansion": "conv"},
        {"hc_res_mix_init": 0.9, "hc_dynamic_gate_init": 1.0},  # far from the identity
        {"hc_dynamic_gate_init": 0.0},
    ],
)
def test_add_conversion_is_exact_for_every_chart_and_expansion(overrides, trained_llama):
    """Positions of real tokens (the EC expansion zeroes padded embeddings, Llama does not)."""
    model = convert_llama_to_ddl_mhc(trained_llama, hc_streams=4, residual="add", **overrides).eval()
    inputs = padded_inputs(trained_llama)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        got, expected = model(**inputs).logits[real], trained_llama(**inputs).logits[real]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_add_conversion_streams_stay_equal_and_the_write_is_one(trained_llama):
    """The mechanism: every stream equals Llama's hidden state at every layer boundary, H_post = 1."""
    model = convert_llama_to_ddl_mhc(trained_llama, hc_streams=4, residual="add").eval()
    ids = token_ids(trained_llama, 2, 10)
    with torch.no_grad():
        expected = trained_llama(ids, output_hidden_states=True).hidden_states
        streams = model(ids, output_stream_states=True).stream_states
    for state, hidden in zip(streams[:-1], expected[:-1], strict=True):
        torch.testing.assert_close(state, hidden.unsqueeze(-2).expand_as(state), atol=1e-5, rtol=0)
    for module in model.modules():
        if isinstance(module, HyperConnection):
            _, maps = module.read(streams[0])
            assert torch.equal(2.0 * torch.sigmoid(maps.write_logit), torch.ones_like(maps.write_logit))


def test_greedy_generation_equals_llamas(trained_llama):
    model = convert_llama_to_ddl_mhc(trained_llama, hc_streams=4, residual="add").eval()
    prompt = token_ids(trained_llama, 2, 5, seed=4)
    settings = {"max_new_tokens": 24, "do_sample": False, "pad_token_id": 0}
    expected = trained_llama.generate(prompt, **settings)
    got = model.generate(prompt, **settings)
    assert torch.equal(got, expected)
    assert len(set(expected[0, 5:].tolist())) > 1  # not a constant continuation


def test_converted_model_round_trips_through_save_pretrained(tmp_path):
    llama = random_llama()
    model = convert_llama_to_ddl_mhc(llama, hc_streams=4, residual="add").eval()
    model.save_pretrained(tmp_path)
    loaded = DDLmHCForCausalLM.from_pretrained(tmp_path).eval()
    ids = token_ids(llama, 2, 8)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, llama(ids).logits, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------------
# Training from the converted point


def map_gradients(model: DDLmHCForCausalLM) -> dict[str, float]:
    """Largest |grad| of every hyper-connection parameter kind, over all sublayers."""
    largest = {}
    for name, param in model.named_parameters():
        if "_connection." in name:
            kind = name.split("_connection.")[1]
            largest[kind] = max(largest.get(kind, 0.0), param.grad.abs().max().item())
    return largest


@pytest.mark.parametrize("dynamic", [True, False])
def test_converted_model_trains_its_maps(dynamic):
    """At the converted point the streams are equal, so the loss does not depend on H_pre or H_res (their
    gradients vanish) and the write gets gradients; once the streams have diverged every map does."""
    llama = random_llama()
    model = convert_llama_to_ddl_mhc(llama, hc_streams=4, residual="add", hc_dynamic=dynamic).train()
    ids = token_ids(llama, 4, 16)
    model(input_ids=ids, labels=ids).loss.backward()
    first = map_gradients(model)
    assert first["write_bias"] > 1e-5
    if dynamic:  # the zeroed write rows get gradients through their nonzero gate
        assert model.model.layers[0].attn_connection.maps_proj.weight.grad[8:].abs().max() > 1e-7
    invariant = [kind for kind in first if kind.startswith(("pre_", "res_"))]
    assert all(first[kind] < 1e-9 for kind in invariant), first  # float rounding only

    adamw_steps(model, lr=1e-2, steps=10)
    later = map_gradients(model)
    assert set(later) == set(first)
    assert all(later[kind] > 1e-9 for kind in later), later
    assert all(later[kind] > 100 * first[kind] for kind in invariant), later
    streams = model(ids, output_stream_states=True).stream_states[-1]
    assert (streams - streams.mean(-2, keepdim=True)).abs().max() > 1e-4 * streams.abs().max()


def test_zero_dynamic_gate_keeps_its_rows_so_the_gate_gets_gradients():
    llama = random_llama()
    model = convert_llama_to_ddl_mhc(llama, hc_streams=4, residual="add", hc_dynamic_gate_init=0.0)
    connection = model.model.layers[0].attn_connection
    assert connection.maps_proj.weight[8:].abs().min() > 0  # the write rows stay random
    ids = token_ids(llama, 2, 8)
    model(input_ids=ids, labels=ids).loss.backward()
    assert connection.write_gate.grad.abs() > 0


# ----------------------------------------------------------------------------------------------
# Breaking the stream symmetry: every exact start (docs/upcycling.md, "Breaking the stream symmetry")


def relative_spread(states: torch.Tensor) -> float:
    return ((states - states.mean(-2, keepdim=True)).norm() / states.norm()).item()


def connections_of(model) -> list[HyperConnection]:
    return [module for module in model.modules() if isinstance(module, HyperConnection)]


@pytest.mark.parametrize("kind", ["random", "trained"])
@pytest.mark.parametrize("dynamic", [True, False])
@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("choice", SYMMETRY_BREAKING)
def test_every_symmetry_breaking_keeps_llamas_logits(choice, n, dynamic, kind, request):
    """Within the add conversion's bound; not vacuous: unequal reads of equal streams, or uniform reads of
    streams that already differ."""
    llama = llama_for(kind, request)
    model = convert_llama_to_ddl_mhc(
        llama, symmetry_breaking=choice, hc_streams=n, residual="add", hc_dynamic=dynamic
    ).eval()
    inputs = padded_inputs(llama)
    with torch.no_grad():
        expected = llama(**inputs).logits
        output = model(**inputs, output_stream_states=True)
    torch.testing.assert_close(output.logits, expected, atol=1e-5, rtol=0)
    reads = torch.stack([torch.softmax(c.pre_bias, -1) for c in connections_of(model)])
    spread = relative_spread(output.stream_states[-1])
    if choice == "write_spread":
        assert spread > 0.02
        torch.testing.assert_close(reads, torch.full_like(reads, 1.0 / n))
        amplitudes = torch.stack([2.0 * torch.sigmoid(c.write_bias) for c in connections_of(model)])
        torch.testing.assert_close(amplitudes.mean(-1), torch.ones(len(amplitudes)), atol=1e-6, rtol=0)
        assert amplitudes.min() < 0.6 and amplitudes.max() > 1.4  # 2 sigmoid(-+1)
        if dynamic:  # uniform for every token: the dynamic read rows are zero, the write rows too
            assert all(c.maps_proj.weight[:n].abs().max() == 0 for c in connections_of(model))
    else:
        assert spread < 1e-5
        assert (reads.max(-1).values - reads.min(-1).values).min() > 0.05
    if choice == "layer_read":  # sublayer k reads stream k mod n with weight 0.7
        chosen = reads.argmax(-1)
        assert chosen.tolist() == [k % n for k in range(len(reads))]
        torch.testing.assert_close(reads.max(-1).values, torch.full((len(reads),), LAYER_READ_WEIGHT))


@pytest.mark.parametrize("choice", SYMMETRY_BREAKING)
@pytest.mark.parametrize(
    "overrides",
    [
        {"hc_chart": "sinkhorn"},
        {"stream_expansion": "conv"},
        {"hc_res_mix_init": 0.9, "hc_dynamic_gate_init": 1.0},
        {"hc_dynamic_gate_init": 0.0},
    ],
)
def test_every_symmetry_breaking_is_exact_for_charts_and_expansions(choice, overrides, trained_llama):
    model = convert_llama_to_ddl_mhc(
        trained_llama, symmetry_breaking=choice, hc_streams=4, residual="add", **overrides
    ).eval()
    inputs = padded_inputs(trained_llama)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        got, expected = model(**inputs).logits[real], trained_llama(**inputs).logits[real]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["random", "trained"])
@pytest.mark.parametrize("choice", SYMMETRY_BREAKING)
def test_every_symmetry_breaking_delta_conversion_meets_the_bound(choice, kind, request):
    """The delta conversion with uniform reads and values (eps / beta) a_i ("write_spread"): the streams' mean
    evolves as in the equal-stream conversion, so the logit gap is as small at a large eps."""
    llama = llama_for(kind, request)
    inputs = padded_inputs(llama)
    model = convert_llama_to_ddl_mhc(
        llama, symmetry_breaking=choice, hc_streams=4, residual="delta", delta_eps=1e4
    ).eval()
    with torch.no_grad():
        output = model(**inputs, output_stream_states=True)
        gap = (output.logits - llama(**inputs).logits).abs().max().item()
    assert gap < 1e-5
    assert (relative_spread(output.stream_states[-1]) > 0.02) == (choice == "write_spread")


def stream_gradients(model, ids) -> tuple[list[torch.Tensor], dict[str, float]]:
    """dL/dX of the stream state leaving every layer but the last, and the largest |grad| of the map kinds."""
    states = []

    def keep(module, args, output):
        output.retain_grad()
        states.append(output)

    hooks = [layer.register_forward_hook(keep) for layer in model.model.layers]
    try:
        model(input_ids=ids, labels=ids).loss.backward()
    finally:
        for hook in hooks:
            hook.remove()
    return [state.grad for state in states[:-1]], map_gradients(model)


def test_symmetry_breaking_makes_the_streams_gradients_or_states_differ_from_the_first_step():
    """At the converted point: unequal reads of equal streams give every stream its own gradient dL/dX_i
    (the wider the reads differ, the more); uniform reads of unequal streams ("write_spread") give equal
    dL/dX_i (H_res^T maps 1 g^T to itself) but already a read and mix gradient, which all the others lack.
    After 20 AdamW steps the streams of every new start have separated more than today's default's."""
    llama = random_llama()
    ids = token_ids(llama, 4, 16)
    spread_of_gradients, read_and_mix, growth = {}, {}, {}
    for choice in SYMMETRY_BREAKING:
        torch.manual_seed(1)
        model = convert_llama_to_ddl_mhc(llama, symmetry_breaking=choice, hc_streams=4, residual="add")
        gradients, largest = stream_gradients(model, ids)
        spread_of_gradients[choice] = min(relative_spread(gradient) for gradient in gradients)
        read_and_mix[choice] = max(largest["pre_bias"], largest["res_bias"])
        with torch.no_grad():
            before = relative_spread(model(ids, output_stream_states=True).stream_states[-1])
        adamw_steps(model, lr=1e-3, steps=20)
        with torch.no_grad():
            after = relative_spread(model(ids, output_stream_states=True).stream_states[-1])
        growth[choice] = after - before
    default = "read_spread"
    assert spread_of_gradients[default] > 0.02 and read_and_mix[default] < 1e-9
    for choice in ("wide_read_spread", "layer_read"):
        assert spread_of_gradients[choice] > 2 * spread_of_gradients[default], spread_of_gradients
        assert read_and_mix[choice] < 1e-9
    assert spread_of_gradients["write_spread"] < 1e-5 and read_and_mix["write_spread"] > 1e-6
    for choice in SYMMETRY_BREAKING:
        if choice != default:
            assert growth[choice] > 2 * growth[default] > 0, growth


def test_conversion_rejects_an_unknown_symmetry_breaking_naming_it():
    with pytest.raises(ValueError, match="symmetry_breaking must be one of .*'write_spread'.*got 'spread'"):
        convert_llama_to_ddl_mhc(random_llama(), symmetry_breaking="spread", hc_streams=4)


# ----------------------------------------------------------------------------------------------
# "delta": O(||h||^2 / eps^2)


def test_delta_write_of_equal_streams_is_the_add_up_to_the_bound():
    """One converted delta sublayer on equal streams X = 1 x^T, float64. With rho = sqrt(||h||^2 + eps^2)
    every stream's error is exactly e = (eps / rho - 1) h - beta (x . h) / rho^2 h, so
    ||e|| <= ||h||^3 / (2 eps^2) + beta ||x|| ||h||^2 / eps^2 (docs/upcycling.md, "The delta update")."""
    llama = random_llama()
    for eps in (1.0, 10.0, 100.0):
        model = convert_llama_to_ddl_mhc(llama, hc_streams=4, residual="delta", delta_eps=eps).double()
        connection = model.model.layers[1].mlp_connection
        torch.manual_seed(0)
        x = 3.0 * torch.randn(64, 32, dtype=torch.float64)
        h = 2.0 * torch.randn(64, 32, dtype=torch.float64)
        streams = x.unsqueeze(-2).expand(64, 4, 32)
        with torch.no_grad():
            read, maps = connection.read(streams)
            updated, _ = connection(streams, h, maps)
        torch.testing.assert_close(read, x, atol=1e-12, rtol=0)
        beta = model.config.delta_beta_init
        rho_squared = h.square().sum(-1, keepdim=True) + eps**2
        error = (eps / rho_squared.sqrt() - 1) * h - beta * (x * h).sum(-1, keepdim=True) / rho_squared * h
        torch.testing.assert_close(updated - (x + h).unsqueeze(-2), error.unsqueeze(-2).expand_as(updated))
        h_norm, x_norm = h.norm(dim=-1), x.norm(dim=-1)
        bound = h_norm**3 / (2 * eps**2) + beta * x_norm * h_norm**2 / eps**2
        assert (error.norm(dim=-1) <= bound).all()
    assert error.norm(dim=-1).max() > 0.1 * bound.max()  # at eps >> ||h|| the bound is tight to ~sqrt(d)


@pytest.mark.parametrize("kind", ["random", "trained"])
def test_delta_conversion_approaches_llama_as_eps_grows(kind, request):
    llama = llama_for(kind, request)
    inputs = padded_inputs(llama)
    with torch.no_grad():
        expected = llama(**inputs).logits
        errors = []
        for eps in (10.0, 100.0, 1e4):
            model = convert_llama_to_ddl_mhc(llama, hc_streams=4, residual="delta", delta_eps=eps).eval()
            errors.append((model(**inputs).logits - expected).abs().max().item())
    assert errors[1] < errors[0] / 30  # O(1 / eps^2): 100x per decade, less where rounding takes over
    assert errors[2] < 1e-5


def test_delta_conversion_at_a_small_eps_warns(caplog):
    from transformers.utils import logging

    logging.enable_propagation()
    try:
        with caplog.at_level("WARNING"):
            convert_llama_to_ddl_mhc(random_llama(), hc_streams=2, residual="delta")
    finally:
        logging.disable_propagation()
    assert "delta_eps" in caplog.text


# ----------------------------------------------------------------------------------------------
# Bad input


def test_conversion_rejects_other_models():
    model = DDLmHCForCausalLM(
        DDLmHCConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4
        )
    )
    for other in (model, None, 3):
        with pytest.raises(TypeError, match="llama_model"):
            convert_llama_to_ddl_mhc(other)


def test_conversion_rejects_checkpoints_of_other_architectures_naming_the_supported(tmp_path):
    config = MistralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4
    )
    MistralForCausalLM(config).save_pretrained(tmp_path / "mistral")
    with pytest.raises(ValueError, match=r"'mistral' checkpoint \(MistralForCausalLM\).*LlamaForCausalLM"):
        convert_llama_to_ddl_mhc(tmp_path / "mistral")
    with pytest.raises(OSError, match="llama_model .*missing.* local folder"):
        convert_llama_to_ddl_mhc(tmp_path / "missing", local_files_only=True)
    with pytest.raises(FileNotFoundError, match="llama_model .*missing.gguf"):
        convert_llama_to_ddl_mhc(tmp_path / "missing.gguf")


def test_folder_conversion_carries_rope_scaling_gqa_ties_and_generation_config(tmp_path):
    """A saved Llama with llama3 RoPE scaling, grouped key/value heads and tied embeddings, converted from its
    folder: the same logits at positions past the original context, and its generation config."""
    torch.manual_seed(0)
    rope = {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        max_position_embeddings=128,
        rope_parameters=rope,
    )
    llama = LlamaForCausalLM(config).eval()
    llama.generation_config.update(eos_token_id=7, pad_token_id=3, max_new_tokens=11)
    llama.save_pretrained(tmp_path / "llama")
    model = convert_llama_to_ddl_mhc(tmp_path / "llama", hc_streams=4).eval()
    assert model.config.rope_parameters == rope and model.config.num_key_value_heads == 2
    assert model.lm_head.weight is model.model.embed_tokens.weight
    generation = model.generation_config
    assert (generation.eos_token_id, generation.pad_token_id, generation.max_new_tokens) == (7, 3, 11)
    ids = token_ids(llama, 2, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, llama(ids).logits, rtol=0, atol=1e-5)
    unscaled = LlamaForCausalLM(LlamaConfig(**{**config.to_dict(), "rope_parameters": None})).eval()
    unscaled.load_state_dict(llama.state_dict())
    with torch.no_grad():
        assert (unscaled(ids).logits - llama(ids).logits).abs().max() > 1e-3  # the scaling matters here


@pytest.mark.parametrize(
    "streams, error",
    [(0, ValueError), (-2, ValueError), (2.0, TypeError), ("4", TypeError), (True, TypeError)],
)
def test_conversion_rejects_bad_stream_counts_naming_them(streams, error):
    with pytest.raises(error, match="hc_streams"):
        convert_llama_to_ddl_mhc(random_llama(), hc_streams=streams, residual="add")


def test_conversion_rejects_bad_overrides_naming_them():
    with pytest.raises(TypeError, match="residual"):
        convert_llama_to_ddl_mhc(random_llama(), hc_streams=4, residual="mix")
    with pytest.raises(ValueError, match="delta_eps"):
        convert_llama_to_ddl_mhc(random_llama(), hc_streams=4, residual="delta", delta_eps=0.0)


# ----------------------------------------------------------------------------------------------
# The experiment's branch (scripts/upcycle_llama.py)


def test_upcycling_branch_continues_llamas_optimizer_schedule_and_batches():
    """After the switch the upcycled arm takes the same step as Llama: same batch, same learning rate, same
    AdamW moments for the copied weights (`inherit_training_state` over `make_optimizer`'s groups), so its
    copied weights move exactly as Llama's do; the new maps start with fresh moments."""
    script = load_script("upcycle_llama.py")
    corpus = torch.randint(0, VOCAB, (500,), generator=torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(0)
    batches = [get_batch(corpus, 2, 8, generator) for _ in range(4)]

    def optimizer_and_schedule(model):
        optimizer = torch.optim.AdamW(parameter_groups(model, 1e-2, 0.1, chart_lr_multiplier=1.0))
        return optimizer, get_cosine_with_min_lr_schedule_with_warmup(optimizer, 2, 10, min_lr_rate=0.1)

    def step(model, optimizer, schedule, batch) -> float:
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    llama = random_llama()
    optimizer, schedule = optimizer_and_schedule(llama)
    for batch in batches[:3]:
        step(llama, optimizer, schedule, batch)
    upcycled = convert_llama_to_ddl_mhc(llama, hc_streams=4, residual="add")
    branch_optimizer, branch_schedule = optimizer_and_schedule(upcycled)
    script.inherit_training_state(branch_optimizer, branch_schedule, upcycled, optimizer, schedule, llama)
    assert [g["lr"] for g in branch_optimizer.param_groups] == [g["lr"] for g in optimizer.param_groups]
    assert branch_schedule.last_epoch == schedule.last_epoch == 3
    loss = step(llama, optimizer, schedule, batches[3])
    branch_loss = step(upcycled, branch_optimizer, branch_schedule, batches[3])
    assert branch_loss == pytest.approx(loss, abs=1e-5)  # same batch, same function
    weights = dict(upcycled.named_parameters())
    for name, param in llama.named_parameters():
        torch.testing.assert_close(weights[name], param, atol=1e-6, rtol=0)
    assert branch_optimizer.state[weights["model.layers.0.attn_connection.write_bias"]]["step"] == 1
    assert branch_optimizer.state[weights["model.embed_tokens.weight"]]["step"] == 4


def test_upcycling_script_branches_in_lockstep(tmp_path):
    """`upcycle_llama.py`'s Trainers: the upcycled runs (one per symmetry breaking) join at the switch and all
    then see the same batches; every evaluation after it finds every arm at the same step (the exact add
    conversions keep them together), and records whether the streams are used."""
    script = load_script("upcycle_llama.py")
    text = tmp_path / "text.txt"
    text.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 60, encoding="utf-8")
    argv = [
        *("--data", str(text), "--max_steps", "8", "--switch_step", "2", "--eval_steps", "2"),
        *("--stop_step", "6", "--symmetry_breaking", "read_spread", "write_spread", "--threads", "1"),
        *("--warmup_steps", "1", "--eval_batches", "2", "--block_size", "16", "--output_dir", str(tmp_path)),
    ]
    args = script.make_parser().parse_args(argv)
    result = script.run(args, torch.device("cpu"))
    arms = ["llama", "upcycled:read_spread", "upcycled:write_spread"]
    assert [len(result["losses"][arm]) for arm in arms] == [6, 4, 4]
    assert [len(result["seconds"][arm]) for arm in arms] == [6, 4, 4]
    # then the new maps train and the arms drift apart slowly (3e-4 here), far less than a step moves the
    # loss (about 0.06): a step out of line would show
    for arm in arms[1:]:
        assert result["losses"][arm] == pytest.approx(result["losses"]["llama"][2:], rel=2e-3)
        assert result["losses"][arm][0] == pytest.approx(result["losses"]["llama"][2], abs=1e-5)
        assert result["switch_gap"][arm] < 1e-5
    assert [entry["step"] for entry in result["history"]] == [0, 2, 4, 6]
    for entry in result["history"][1:]:
        for arm in arms[1:]:
            for split in ("train", "val"):
                assert entry[arm][split] == pytest.approx(entry["llama"][split], rel=2e-3), entry["step"]
    at_switch = result["history"][1]
    assert at_switch["upcycled:read_spread"]["stream_spread_last"] < 1e-5
    assert at_switch["upcycled:read_spread"]["stream_rank_last"] == pytest.approx(1.0, abs=1e-3)
    assert at_switch["upcycled:write_spread"]["stream_spread_last"] > 0.02
    assert abs(at_switch["upcycled:write_spread"]["composite_gain_max"] - 1) < 1e-5
    summary = script.summarize(args, result)
    assert summary["steps"] == 6 and summary["schedule_steps"] == 8
    assert set(summary["final_stream_use"]) == set(arms[1:])
    script.plot(args, result, tmp_path / "losses.png")
    assert (tmp_path / "losses.png").stat().st_size > 10_000
    single = script.run(script.make_parser().parse_args([*argv, "--hc_streams", "1"]), torch.device("cpu"))
    assert single["losses"]["upcycled:read_spread"] == single["losses"]["llama"][2:]  # Llama's block exactly
    assert set(single["history"][-1]["upcycled:write_spread"]) == {"train", "val"}  # no streams to measure
    for bad in (
        ["--stop_step", "2"],
        ["--stop_step", "5"],
        ["--symmetry_breaking", "layer_read", "layer_read"],
    ):
        with pytest.raises(ValueError, match="--stop_step|--symmetry_breaking"):
            script.run(script.make_parser().parse_args([*argv, *bad]), torch.device("cpu"))
