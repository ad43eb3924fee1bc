"""DDL-mHC causal LM (docs/ddl_mhc.md): Llama equivalence, the delta/mix equations against float64
references, cached decoding, save/load, exact doubly-stochastic mixing and the non-expansive property,
numerics (10x learning rate, bf16 autocast) and clear errors for bad input."""

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
)

import geoformers
from geoformers import DDLmHCConfig, DDLmHCForCausalLM, DDLmHCModel, convert_llama_to_ddl_mhc
from geoformers.models.ddl_mhc.modeling_ddl_mhc import HyperConnection, StreamExpansion, unit_direction
from geoformers.models.ddl_mhc.ops.charts import birkhoff, ds_violation
from geoformers.models.ddl_mhc.ops.stream_write.node import AddMixWrite

VOCAB = 61
SMALL = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4
)
CHARTS = ("tbp", "rtbp", "sinkhorn", "mhc_lite", "kromhc")
EXACT_CHARTS = ("tbp", "rtbp", "mhc_lite", "kromhc")


pytestmark = pytest.mark.usefixtures("single_thread")


def small_model(seed: int = 0, randomize: bool = True, **overrides) -> DDLmHCForCausalLM:
    """A tiny model in eval mode; with `randomize`, every DDL-mHC parameter moves off its near-identity
    initialisation (random EC taps, biases, gates, mixing weight), so no path is trivially the identity."""
    torch.manual_seed(seed)
    model = DDLmHCForCausalLM(DDLmHCConfig(**{**SMALL, **overrides})).eval()
    if randomize:
        randomize_hyper_connections(model, seed)
    return model


@torch.no_grad()
def randomize_hyper_connections(model: DDLmHCForCausalLM, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed + 1)
    for name, param in model.named_parameters():
        if "connection" in name or "stream_" in name:
            if name.endswith(("_gate", "res_mix_logit")):
                param.copy_(torch.rand(param.shape, generator=generator) + 0.3)
            elif "stream_expansion" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
            elif "_proj" not in name:
                param.copy_(torch.randn(param.shape, generator=generator))


def token_ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------
# Configuration


def without_path(config_dict: dict) -> dict:
    return {key: value for key, value in config_dict.items() if key != "_name_or_path"}


def test_config_json_round_trip_and_auto_registration(tmp_path):
    config = DDLmHCConfig(**SMALL, hc_streams=2, hc_chart="kromhc", stream_expansion="conv", rope_theta=5e5)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, DDLmHCConfig)
    assert without_path(loaded.to_dict()) == without_path(config.to_dict())
    from_json = DDLmHCConfig.from_json_file(tmp_path / "config.json")
    assert without_path(from_json.to_dict()) == without_path(config.to_dict())
    assert loaded.rope_parameters["rope_theta"] == 5e5 == loaded.rope_theta
    assert type(AutoConfig.for_model("ddl_mhc")) is DDLmHCConfig
    assert config.layer_types == ["hybrid", "full_attention"]
    assert DDLmHCConfig(**SMALL).layer_types == ["full_attention", "full_attention"]


@pytest.mark.parametrize(
    ("overrides", "error", "field"),
    [
        ({"hc_chart": "kromhc", "hc_streams": 3}, ValueError, "hc_streams"),
        ({"hc_chart": "mhc_lite", "hc_streams": 7}, ValueError, "hc_streams"),
        ({"hc_chart": "birkhoff"}, TypeError, "hc_chart"),
        ({"hidden_size": 30}, ValueError, "hidden_size"),
        ({"num_key_value_heads": 3}, ValueError, "num_key_value_heads"),
        ({"residual": "mul"}, TypeError, "residual"),
        ({"stream_expansion": "tile"}, TypeError, "stream_expansion"),
        ({"hc_streams": 0}, ValueError, "hc_streams"),
        ({"hc_streams": "4"}, TypeError, "hc_streams"),
        ({"hc_dynamic": 1}, TypeError, "hc_dynamic"),
        ({"delta_beta_init": 2.0}, ValueError, "delta_beta_init"),
        ({"delta_beta_init": 0.0}, ValueError, "delta_beta_init"),
        ({"delta_eps": 0.0}, ValueError, "delta_eps"),
        ({"hc_res_mix_init": 1.0}, ValueError, "hc_res_mix_init"),
        ({"stream_conv_kernel": 0}, ValueError, "stream_conv_kernel"),
        ({"rope_theta": -1.0}, ValueError, "rope_theta"),
        ({"hidden_act": "swish2"}, ValueError, "hidden_act"),
        ({"vocab_size": 0}, ValueError, "vocab_size"),
        ({"pad_token_id": VOCAB}, ValueError, "pad_token_id"),
    ],
)
def test_config_rejects_bad_fields_naming_them(overrides, error, field):
    with pytest.raises(error, match=field):
        DDLmHCConfig(**{**SMALL, **overrides})


# ----------------------------------------------------------------------------------------------
# Independent reference: transformers' Llama


def llama_reference(tie: bool, vocab_size: int = VOCAB) -> LlamaForCausalLM:
    torch.manual_seed(3)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=500.0,
        tie_word_embeddings=tie,
    )
    llama = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms away from 1 so a dropped or swapped norm would show
        for name, param in llama.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.3 * torch.randn_like(param))
    return llama


@pytest.mark.parametrize("tie", [False, True])
def test_n1_add_equals_llama_logits_and_loss(tie):
    llama = llama_reference(tie)
    model = convert_llama_to_ddl_mhc(llama).eval()
    assert set(model.state_dict()) == set(llama.state_dict())  # the conversion is a state-dict copy
    ids = token_ids(3, 12)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    labels = ids.clone()
    labels[1, 5:] = -100
    with torch.no_grad():
        expected = llama(input_ids=ids, attention_mask=mask, labels=labels)
        got = model(input_ids=ids, attention_mask=mask, labels=labels)
    torch.testing.assert_close(got.logits, expected.logits, atol=1e-5, rtol=0)
    assert got.loss.item() == pytest.approx(expected.loss.item(), abs=1e-6)


# ----------------------------------------------------------------------------------------------
# The update equations against float64 references


def test_n1_delta_is_ddl_with_scalar_value():
    """x' = x + beta k (v - k . x) (DDL eq. 3.7), written out by hand in float64."""
    torch.manual_seed(0)
    config = DDLmHCConfig(**SMALL, hc_streams=1, residual="delta")
    block = HyperConnection(config).double()
    with torch.no_grad():
        block.write_bias.fill_(0.4)
        block.write_gate.fill_(0.7)
        block.delta.value_proj.bias.fill_(0.2)
    x = torch.randn(5, 1, 32, dtype=torch.float64)
    h = torch.randn(5, 32, dtype=torch.float64)
    hidden, maps = block.read(x)
    assert torch.equal(hidden, x[:, 0])  # n = 1: the read is the stream itself
    updated, record = block(x, h, maps)

    state = x[:, 0]
    t_beta = 0.4 + 0.7 * block.maps_proj(state)[:, 0] / state.pow(2).mean(-1).add(config.rms_norm_eps).sqrt()
    beta = 2 * torch.sigmoid(t_beta)
    k = h / torch.sqrt((h * h).sum(-1, keepdim=True) + config.delta_eps**2)
    v = h @ block.delta.value_proj.weight[0] + 0.2
    expected = state + (beta * (v - (k * state).sum(-1)))[:, None] * k
    torch.testing.assert_close(updated[:, 0], expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(record.beta[:, 0], beta, atol=1e-12, rtol=0)


@pytest.mark.parametrize("residual", ["delta", "add"])
def test_stream_update_matches_matrix_formula(residual):
    """X' = H_res X (I - beta k k^T) + beta v k^T  /  X' = H_res X + H_post^T h, with explicit matrices."""
    torch.manual_seed(1)
    config = DDLmHCConfig(**SMALL, hc_streams=4, residual=residual, hc_chart="rtbp")
    block = HyperConnection(config).double()
    with torch.no_grad():
        for param in (block.pre_bias, block.res_bias, block.write_bias):
            param.copy_(torch.randn_like(param))
        block.res_mix_logit.fill_(0.5)
    x = torch.randn(2, 3, 4, 32, dtype=torch.float64)
    h = torch.randn(2, 3, 32, dtype=torch.float64)
    hidden, maps = block.read(x)
    updated, record = block(x, h, maps)

    read_weights = torch.softmax(block._map_logits(x)[0], -1)
    torch.testing.assert_close(hidden, torch.einsum("btn,btnd->btd", read_weights, x))
    mix, chart = torch.sigmoid(block.res_mix_logit), birkhoff(block._map_logits(x)[1], 4, "rtbp")
    identity = torch.eye(4, dtype=torch.float64)
    torch.testing.assert_close(maps.h_res, (1 - mix) * identity + mix * chart, atol=0, rtol=0)
    for b in range(2):
        for t in range(3):
            mixing = maps.h_res[b, t]
            if residual == "delta":
                k = unit_direction(h[b, t], config.delta_eps)
                beta = record.beta[b, t]
                v = block.delta.value_proj(h[b, t])
                erase = torch.eye(32, dtype=torch.float64) - beta * torch.outer(k, k)
                expected = mixing @ x[b, t] @ erase + beta * torch.outer(v, k)
            else:
                post = 2 * torch.sigmoid(maps.write_logit[b, t])
                expected = mixing @ x[b, t] + torch.outer(post, h[b, t])
            torch.testing.assert_close(updated[b, t], expected, atol=1e-12, rtol=0)


def test_mix_and_write_gradients():
    """The hand-written backward of X' = H X + s u^T against finite differences (float64)."""
    generator = torch.Generator().manual_seed(0)
    inputs = [
        torch.rand(2, 3, 4, 4, dtype=torch.float64, generator=generator),
        torch.randn(2, 3, 4, 5, dtype=torch.float64, generator=generator),
        torch.randn(2, 3, 4, dtype=torch.float64, generator=generator),
        torch.randn(2, 3, 5, dtype=torch.float64, generator=generator),
    ]
    assert torch.autograd.gradcheck(AddMixWrite.apply, [t.requires_grad_() for t in inputs])


def test_conv_expansion_matches_explicit_causal_convolution():
    """EC: stream j of channel c at time t = sum_i w[c, j, i] e[t - (K-1) + i, c] (zeros before t = 0)."""
    config = DDLmHCConfig(**SMALL, hc_streams=3, stream_expansion="conv", stream_conv_kernel=3)
    expansion = StreamExpansion(config).double()
    with torch.no_grad():
        expansion.weight.copy_(torch.randn_like(expansion.weight))
    embeds = torch.randn(2, 5, 32, dtype=torch.float64)
    taps = expansion.weight.view(32, 3, 3)  # (channel, stream, tap)
    expected = torch.zeros(2, 5, 3, 32, dtype=torch.float64)
    for t in range(5):
        for i in range(3):
            source = t - 2 + i
            if source >= 0:
                expected[:, t] += taps[:, :, i].T * embeds[:, source, None, :]
    torch.testing.assert_close(expansion(embeds), expected, atol=1e-12, rtol=0)


def test_initialisation_is_near_identity():
    model = small_model(randomize=False, hc_streams=4, stream_expansion="conv", hc_dynamic=False)
    embeds = torch.randn(2, 6, 32)
    streams = model.model.stream_expansion(embeds)
    assert torch.equal(streams, embeds[:, :, None, :].expand(-1, -1, 4, -1))  # identity EC
    assert torch.equal(model.model.stream_readout(streams), embeds)  # mean read-out of equal streams
    out = model(token_ids(1, 5), output_mixing=True)
    for record in out.mixing:
        assert record.h_res.shape == (4, 4)  # static maps: one matrix for all tokens
        assert torch.allclose(record.h_res.diagonal(), torch.full((4,), 0.95 + 0.05 * 0.25))  # rtbp(0) = J/n
        torch.testing.assert_close(record.beta, torch.ones(1))  # delta_beta_init


# ----------------------------------------------------------------------------------------------
# Cache, generation, attention backends, checkpointing


@pytest.mark.parametrize("expansion", ["repeat", "conv"])
@pytest.mark.parametrize("chart", CHARTS)
@pytest.mark.parametrize("residual", ["delta", "add"])
def test_incremental_decoding_equals_full_forward(residual, chart, expansion):
    model = small_model(hc_streams=4, residual=residual, hc_chart=chart, stream_expansion=expansion)
    ids = token_ids(2, 9)
    with torch.no_grad():
        full = model(ids).logits
        cache = DynamicCache(config=model.config)
        steps = [model(ids[:, :2], cache=cache, use_cache=True).logits]  # prefill shorter than the EC kernel
        for t in range(2, 9):
            steps.append(model(ids[:, t : t + 1], cache=cache, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)

    prompt = ids[:1, :4]
    cached = model.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0)
    uncached = model.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=False, pad_token_id=0)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("overrides", [{"hc_streams": 1, "residual": "delta"}, {"hc_dynamic": False}])
def test_incremental_decoding_other_ablations(overrides):
    model = small_model(stream_expansion="conv", **overrides)
    ids = token_ids(2, 7)
    with torch.no_grad():
        full = model(ids).logits
        cache = DynamicCache(config=model.config)
        steps = [model(ids[:, :5], cache=cache, use_cache=True).logits]
        steps += [model(ids[:, t : t + 1], cache=cache, use_cache=True).logits for t in (5, 6)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


def test_left_padding_does_not_leak_through_the_conv_expansion():
    model = small_model(hc_streams=4, stream_expansion="conv")
    ids = token_ids(1, 6)
    padded = torch.cat([torch.full((1, 3), 5), ids], 1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 6, dtype=torch.long)], 1)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        alone = model(ids).logits
        batched = model(padded, attention_mask=mask, position_ids=position_ids).logits[:, 3:]
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=0)


def test_sampling_generation_runs():
    model = small_model(hc_streams=4)
    torch.manual_seed(0)
    out = model.generate(token_ids(2, 3), max_new_tokens=5, do_sample=True, top_k=10, pad_token_id=0)
    assert out.shape == (2, 8) and int(out.max()) < VOCAB


def test_eager_and_sdpa_agree():
    ids = token_ids(2, 8)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    eager = small_model(seed=4, hc_streams=4, attn_implementation="eager")
    sdpa = small_model(seed=4, hc_streams=4, attn_implementation="sdpa")
    assert eager.config._attn_implementation == "eager" and sdpa.config._attn_implementation == "sdpa"
    with torch.no_grad():  # padded query rows attend to nothing: backends differ there, by design
        expected = eager(ids, attention_mask=mask).logits[mask.bool()]
        got = sdpa(ids, attention_mask=mask).logits[mask.bool()]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_gradient_checkpointing_gives_the_same_gradients():
    ids = token_ids(2, 8)
    grads = []
    for checkpointing in (False, True):
        model = small_model(seed=5, hc_streams=4, stream_expansion="conv").train()
        if checkpointing:
            model.activation_checkpointing_enable()
            assert all(layer.gradient_checkpointing for layer in model.model.layers)
        model(ids, labels=ids).loss.backward()
        grads.append({name: p.grad for name, p in model.named_parameters()})
    assert all(g is not None for g in grads[1].values())
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("chart", CHARTS)
def test_compiles_as_one_graph_with_eager_gradients(chart):
    """torch.compile(fullgraph=True) traces the whole training forward, custom chart autograd included
    (aot_eager: the same graph inductor gets, without its minutes of C++ code generation on a CPU)."""
    ids = token_ids(2, 8)
    grads = []
    for compiled in (False, True):
        torch._dynamo.reset()
        model = small_model(seed=6, num_hidden_layers=1, hc_streams=4, hc_chart=chart).train()
        forward = torch.compile(model, fullgraph=True, backend="aot_eager") if compiled else model
        output = forward(ids, labels=ids)
        output.loss.backward()
        grads.append((output.loss.detach(), {name: p.grad for name, p in model.named_parameters()}))
    torch.testing.assert_close(grads[1][0], grads[0][0], atol=1e-6, rtol=0)
    for name, grad in grads[0][1].items():
        torch.testing.assert_close(grads[1][1][name], grad, atol=1e-6, rtol=1e-5, msg=name)


# ----------------------------------------------------------------------------------------------
# Save / load


def test_save_and_auto_load_round_trip(tmp_path):
    model = small_model(hc_streams=4, stream_expansion="conv", hc_chart="tbp")
    ids = token_ids(2, 6)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file() and not (tmp_path / "pytorch_model.bin").exists()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is DDLmHCForCausalLM
    assert without_path(loaded.config.to_dict()) == without_path(model.config.to_dict())
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    base = AutoModel.from_pretrained(tmp_path)
    assert type(base) is DDLmHCModel


# ----------------------------------------------------------------------------------------------
# Exact doubly-stochastic mixing and the non-expansive property


def linear_part(h_res: torch.Tensor, beta: torch.Tensor | None, k: torch.Tensor | None) -> torch.Tensor:
    """Matrix of X -> H_res X (I - beta k k^T) on row-major vec(X): H_res (x) (I - beta k k^T); for "add"
    (no k) the erase factor is the identity and the norm is that of H_res."""
    if k is None:
        return h_res
    erase = torch.eye(k.shape[-1], dtype=torch.float64) - beta * torch.outer(k, k)
    return torch.kron(h_res, erase)


@pytest.mark.parametrize("residual", ["delta", "add"])
@pytest.mark.parametrize("chart", EXACT_CHARTS)
def test_mixing_is_doubly_stochastic_and_non_expansive(chart, residual):
    model = small_model(seed=6, hc_streams=4, hc_chart=chart, residual=residual, num_hidden_layers=3)
    ids = token_ids(2, 4)
    with torch.no_grad():
        records = model(ids, output_mixing=True).mixing
    assert len(records) == 2 * 3
    for record in records:
        assert record.h_res.dtype == torch.float32
        assert float(ds_violation(record.h_res).max()) <= 1e-6
        assert float(record.h_res.min()) >= 0.0
        if residual == "delta":
            assert 0.0 < float(record.beta.min()) and float(record.beta.max()) < 2.0
    for b in range(2):
        for t in range(4):
            product = None
            for record in records:
                beta = None if record.beta is None else record.beta[b, t].double()
                k = None if record.direction is None else record.direction[b, t].double()
                step = linear_part(record.h_res[b, t].double(), beta, k)
                assert torch.linalg.matrix_norm(step, ord=2) <= 1 + 1e-5
                product = step if product is None else step @ product
            assert torch.linalg.matrix_norm(product, ord=2) <= 1 + 1e-5


# ----------------------------------------------------------------------------------------------
# Numerics


def test_ten_times_the_learning_rate_stays_finite():
    model = small_model(seed=7, hc_streams=4, stream_expansion="conv").train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)  # 10x train_causal_lm.py's default
    ids = token_ids(4, 16)
    for _ in range(5):
        loss = model(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        assert math.isfinite(loss.item())
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_zero_state_is_finite():
    """A padding token's embedding is zero: every norm and direction must stay finite at X = 0, h = 0."""
    model = small_model(seed=8, hc_streams=4, pad_token_id=0).train()
    with torch.no_grad():
        model.model.embed_tokens.weight[0].zero_()
    ids = torch.zeros(1, 4, dtype=torch.long)
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert math.isfinite(loss.item())
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


def test_bf16_autocast_runs_close_to_float32_with_float32_charts():
    model = small_model(seed=9, hc_streams=4)
    ids = token_ids(2, 8)
    with torch.no_grad():
        reference = F.log_softmax(model(ids).logits, -1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(ids, output_mixing=True)
    assert all(record.h_res.dtype == torch.float32 for record in out.mixing)
    assert all(float(ds_violation(record.h_res).max()) <= 1e-6 for record in out.mixing)
    assert (F.log_softmax(out.logits.float(), -1) - reference).abs().max() < 0.05


# ----------------------------------------------------------------------------------------------
# Bad input


def test_out_of_range_token_ids_name_input_ids_and_vocab():
    model = small_model(randomize=False)
    with pytest.raises(ValueError, match=rf"input_ids.*vocab_size={VOCAB}"):
        model(torch.tensor([[1, VOCAB]]))
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.tensor([[-1, 2]]))
    with pytest.raises(TypeError, match="input_ids"):
        model(torch.tensor([[1.0, 2.0]]))


def test_mask_and_label_shape_mismatches_are_named():
    model = small_model(randomize=False)
    ids = token_ids(2, 5)
    with pytest.raises(ValueError, match="attention_mask"):
        model(ids, attention_mask=torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="labels"):
        model(ids, labels=ids[:, :4])
    with pytest.raises(ValueError, match="inputs_embeds"):
        model(input_ids=ids, inputs_embeds=torch.zeros(2, 5, 32))


def test_conv_expansion_needs_a_cache_built_from_the_config():
    model = small_model(stream_expansion="conv")
    with pytest.raises(ValueError, match="DynamicCache\\(config=model.config\\)"):
        model(token_ids(1, 3), cache=DynamicCache(), use_cache=True)


# ----------------------------------------------------------------------------------------------
# PEFT and registration


def test_peft_lora_reaches_the_hyper_connection_projections():
    from peft import LoraConfig, get_peft_model

    model = small_model(hc_streams=4)
    lora = get_peft_model(model, LoraConfig(r=2, target_modules=["maps_proj", "value_proj", "q_proj"]))
    trainable = {name for name, p in lora.named_parameters() if p.requires_grad}
    assert any("maps_proj.lora_A" in name for name in trainable)
    assert any("value_proj.lora_B" in name for name in trainable)
    lora(token_ids(1, 4)).logits.sum().backward()


def test_registered_on_import():
    assert geoformers.DDLmHCForCausalLM is DDLmHCForCausalLM
    model = AutoModelForCausalLM.from_config(DDLmHCConfig(**SMALL))
    assert type(model) is DDLmHCForCausalLM
