"""The fused hyper-connection sublayer (the autograd nodes of `ops/stream_read/node.py` and
`ops/stream_write/node.py`) against the plain PyTorch reference path:
finite-difference gradients of every node in float64, and whole models (the path the rule picks vs
`ops_path("naive")`, same model) for every chart, n in {1, 2, 4, 8}, both residuals, fp32 and bf16
autocast."""

import contextlib

import pytest
import torch

from geoformers import DDLmHCConfig, DDLmHCForCausalLM
from geoformers.models.ddl_mhc.ops.dispatch import ops_path, run_node
from geoformers.models.ddl_mhc.ops.stream_read.naive import naive_read_streams
from geoformers.models.ddl_mhc.ops.stream_read.node import StreamMapsRead, StreamRead
from geoformers.models.ddl_mhc.ops.stream_write.naive import naive_mix_and_write
from geoformers.models.ddl_mhc.ops.stream_write.node import AddMixWrite, DeltaMixWrite

SMALL = dict(vocab_size=37, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2)


pytestmark = pytest.mark.usefixtures("single_thread")


def _random(*shape, generator, positive=False):
    values = torch.rand(*shape, dtype=torch.float64, generator=generator)
    if not positive:
        values = 2 * values - 1
    return values.requires_grad_()


def test_node_gradients_match_finite_differences():
    generator = torch.Generator().manual_seed(0)
    streams = _random(2, 3, 4, 5, generator=generator)
    h_res = _random(2, 3, 4, 4, generator=generator, positive=True)
    direction, value = _random(2, 3, 5, generator=generator), _random(2, 3, 4, generator=generator)
    amplitudes, weights = _random(2, 3, 4, generator=generator), _random(2, 3, 4, generator=generator)
    for beta in (_random(2, 3, 1, generator=generator, positive=True), _random(1, generator=generator)):
        delta = lambda *args: DeltaMixWrite.apply(*args)[0]
        assert torch.autograd.gradcheck(delta, (h_res, streams, direction, beta, value))
        assert torch.autograd.gradcheck(delta, (None, streams, direction, beta, value))  # H_res = I
    assert torch.autograd.gradcheck(AddMixWrite.apply, (h_res, streams, amplitudes, direction))
    assert torch.autograd.gradcheck(StreamRead.apply, (weights, streams))
    projected = _random(2, 3, 14, generator=generator)  # an input of its own: dP is checked apart from dX
    pre_bias, pre_gate = _random(4, generator=generator), _random((), generator=generator)
    maps_read = lambda *args: StreamMapsRead.apply(*args, 1e-3)
    assert torch.autograd.gradcheck(maps_read, (streams, projected, pre_bias, pre_gate))


def test_nodes_equal_reference_formulas():
    """Forward values of each node against the plain formulas it replaces (float64, hand-written)."""
    generator = torch.Generator().manual_seed(1)
    streams = _random(3, 4, 6, generator=generator).detach()
    h_res = _random(3, 4, 4, generator=generator, positive=True).detach()
    k, v = _random(3, 6, generator=generator).detach(), _random(3, 4, generator=generator).detach()
    beta = _random(3, 1, generator=generator, positive=True).detach()
    mixed = h_res @ streams
    expected = mixed + (beta * (v - (mixed @ k[..., None])[..., 0]))[..., None] * k[:, None, :]
    updated, amplitudes = DeltaMixWrite.apply(h_res, streams, k, beta, v)
    torch.testing.assert_close(updated, expected, atol=1e-14, rtol=0)
    torch.testing.assert_close(amplitudes, beta * (v - (mixed @ k[..., None])[..., 0]), atol=1e-14, rtol=0)
    added = AddMixWrite.apply(h_res, streams, v, k)
    torch.testing.assert_close(added, naive_mix_and_write(h_res, streams, v, k))
    torch.testing.assert_close(StreamRead.apply(v, streams), naive_read_streams(v, streams))

    weight, pre_bias = _random(9, 24, generator=generator).detach(), _random(4, generator=generator).detach()
    gate = torch.tensor(0.3, dtype=torch.float64)
    flat = streams.flatten(-2)
    terms, hidden = StreamMapsRead.apply(streams, flat @ weight.T, pre_bias, gate, 0.5)
    inverse_rms = 1 / torch.sqrt(flat.pow(2).mean(-1, keepdim=True) + 0.5)
    torch.testing.assert_close(terms, flat @ weight.T * inverse_rms, atol=1e-14, rtol=0)
    read = torch.softmax(pre_bias + 0.3 * terms[:, :4], -1)
    torch.testing.assert_close(hidden, (read[..., None] * streams).sum(1), atol=1e-14, rtol=0)


def _model(**overrides):
    torch.manual_seed(0)
    model = DDLmHCForCausalLM(DDLmHCConfig(**SMALL, **overrides))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # move every hyper-connection parameter off its near-identity start
        for name, param in model.named_parameters():
            if "connection" in name or "stream_" in name:
                param.add_(0.3 * torch.randn(param.shape, generator=generator))
    return model


def _loss_and_grads(model, ids, autocast=False, path=None):
    """Logits, loss and parameter gradients on the path the rule picks, or inside `ops_path(path)`."""
    model.zero_grad(set_to_none=True)
    with (
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast),
        ops_path(path) if path else contextlib.nullcontext(),
    ):
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), out.loss.detach(), grads


CASES = [
    (chart, n, residual)
    for chart, sizes in {
        "rtbp": (1, 2, 4, 8),
        "tbp": (2, 4, 8),
        "sinkhorn": (2, 4),
        "mhc_lite": (2, 4),
        "kromhc": (2, 4, 8),
    }.items()
    for n in sizes
    for residual in ("delta", "add")
]


@pytest.mark.parametrize(("chart", "n", "residual"), CASES)
def test_fused_model_equals_reference(chart, n, residual):
    """float64: equal to 1e-12 (same function). float32: logits to 1e-6; gradients, sums over every token,
    to 1e-5 of their largest entry (float32 rounding: the float64 comparison shows there is no other gap)."""
    ids = torch.randint(0, SMALL["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(2))
    for dtype, logits_tol, grad_tol in ((torch.float64, 1e-12, 1e-12), (torch.float32, 1e-6, 1e-5)):
        model = _model(hc_streams=n, hc_chart=chart, residual=residual).to(dtype)
        logits_f, loss_f, grads_f = _loss_and_grads(model, ids)
        logits_r, loss_r, grads_r = _loss_and_grads(model, ids, path="naive")
        torch.testing.assert_close(logits_f, logits_r, atol=logits_tol, rtol=0)
        assert grads_f.keys() == grads_r.keys()
        for name in grads_r:
            scale = grads_r[name].abs().max().clamp_min(1.0)
            torch.testing.assert_close(
                grads_f[name] / scale, grads_r[name] / scale, atol=grad_tol, rtol=0, msg=f"{dtype} {name}"
            )


@pytest.mark.parametrize("residual", ["delta", "add"])
@pytest.mark.parametrize("n", [1, 4])
def test_fused_model_equals_reference_bf16_autocast(n, residual):
    """Logits and loss agree to bf16 tolerance between the two paths, and each path's gradients are within
    bf16 noise of the float64 model's: 10 % of the largest entry for a tensor, 25 % for a one-element gate,
    whose gradient sums every token's rounded contribution with cancellation (measured at most 7.4 % and
    15.5 % over these four cases)."""
    model = _model(hc_streams=n, residual=residual)
    ids = torch.randint(0, SMALL["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(3))
    logits_f, loss_f, grads_f = _loss_and_grads(model, ids, autocast=True)
    logits_r, loss_r, grads_r = _loss_and_grads(model, ids, autocast=True, path="naive")
    _, _, grads_64 = _loss_and_grads(_model(hc_streams=n, residual=residual).double(), ids)
    torch.testing.assert_close(logits_f, logits_r, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(loss_f, loss_r, atol=1e-2, rtol=1e-2)
    assert grads_f.keys() == grads_r.keys() == grads_64.keys()
    for name, reference in grads_64.items():
        scale = reference.abs().max().clamp_min(1e-3)
        tolerance = 0.1 if reference.numel() > 1 else 0.25
        for path, grads in (("node", grads_f), ("naive", grads_r)):
            error = (grads[name].double() - reference).abs().max() / scale
            assert error <= tolerance, f"{path} {name}: {float(error):.3g}"


def test_static_maps_and_peft_keep_the_fused_path_with_the_reference_results(monkeypatch):
    """hc_dynamic=False reads with one static H_pre; a PEFT-wrapped maps_proj runs first, as its module, and
    the fused `StreamMapsRead` node after it (counted here), with the reference path's logits and adapter
    gradients."""
    from peft import LoraConfig, get_peft_model

    ids = torch.randint(0, SMALL["vocab_size"], (2, 5), generator=torch.Generator().manual_seed(4))
    static = _model(hc_streams=4, hc_dynamic=False)
    with ops_path("naive"):
        expected = static(ids).logits
    torch.testing.assert_close(static(ids).logits, expected, atol=1e-6, rtol=0)
    lora = LoraConfig(r=2, target_modules=["maps_proj"], init_lora_weights=False)
    model = get_peft_model(_model(hc_streams=4), lora)
    calls = []
    forward = StreamMapsRead.forward
    monkeypatch.setattr(StreamMapsRead, "forward", lambda *a: calls.append(1) or forward(*a))
    results = {}
    for path in ("node", "naive"):
        calls.clear()
        with ops_path(path):
            logits = model(ids).logits
            adapters = [p for name, p in model.named_parameters() if "lora_" in name]
            grads = torch.autograd.grad(logits.square().sum(), adapters)
        results[path] = (logits.detach(), grads, len(calls))
    assert results["node"][2] == 2 * SMALL["num_hidden_layers"] and results["naive"][2] == 0
    torch.testing.assert_close(results["node"][0], results["naive"][0], atol=1e-6, rtol=0)
    for mine, theirs in zip(results["node"][1], results["naive"][1], strict=True):
        assert theirs.abs().max() > 0
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-4)


def test_run_node_skips_the_autograd_node_only_when_no_gradient_is_needed():
    """Without a gradient (decoding) each node's forward runs alone: the same outputs, no graph; with one,
    the node itself (its backward is the one the finite-difference test checks)."""
    generator = torch.Generator().manual_seed(2)
    streams = _random(2, 3, 4, 5, generator=generator)
    h_res = _random(2, 3, 4, 4, generator=generator, positive=True)
    direction, value = _random(2, 3, 5, generator=generator), _random(2, 3, 4, generator=generator)
    beta = _random(2, 3, 1, generator=generator, positive=True)
    weights = _random(2, 3, 4, generator=generator)
    projected, gate = _random(2, 3, 14, generator=generator), _random((), generator=generator)
    cases = [
        (DeltaMixWrite, (h_res, streams, direction, beta, value)),
        (AddMixWrite, (h_res, streams, value, direction)),
        (StreamRead, (weights, streams)),
        (StreamMapsRead, (streams, projected, weights[0, 0], gate, 1e-3)),
    ]
    for node, args in cases:
        with torch.no_grad():
            alone = run_node(node, *args)
        attached = run_node(node, *args)
        alone, attached = ((out,) if isinstance(out, torch.Tensor) else out for out in (alone, attached))
        assert type(attached[0].grad_fn).__name__ == f"{node.__name__}Backward"
        for plain, tracked in zip(alone, attached, strict=True):
            assert plain.grad_fn is None and not plain.requires_grad
            torch.testing.assert_close(plain, tracked.detach(), rtol=0, atol=0)
    detached = [arg.detach() if isinstance(arg, torch.Tensor) else arg for arg in cases[1][1]]
    assert run_node(AddMixWrite, *detached).grad_fn is None  # grad mode on, but no input needs a gradient


def test_a_config_with_the_former_hc_implementation_field_still_loads(tmp_path):
    """How the ops run is not configured any more: a config.json saved with `hc_implementation` loads, the
    field dropped (not stored, not saved again), and the model is the one the other fields describe."""
    import json

    DDLmHCConfig(**SMALL, hc_streams=2).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    saved = json.loads(path.read_text())
    assert "hc_implementation" not in saved
    for value in ("reference", "fused"):
        path.write_text(json.dumps({**saved, "hc_implementation": value}))
        loaded = DDLmHCConfig.from_pretrained(tmp_path)
        assert not hasattr(loaded, "hc_implementation") and "hc_implementation" not in loaded.to_dict()
        assert loaded.hc_streams == 2 and loaded.hidden_size == SMALL["hidden_size"]
    assert not hasattr(DDLmHCConfig(**SMALL, hc_implementation="reference"), "hc_implementation")


@pytest.mark.parametrize("expansion", ["repeat", "conv"])
def test_compiled_static_cache_decode_equals_eager_dynamic_decode(expansion):
    """generate(cache_implementation="static") with the forward compiled as one graph (Dynamo, fullgraph;
    the eager backend keeps the test fast) gives the eager dynamic-cache tokens, token for token."""
    from transformers import CompileConfig

    torch.manual_seed(0)
    config = DDLmHCConfig(**SMALL, hc_streams=4, stream_expansion=expansion, pad_token_id=0)
    model = DDLmHCForCausalLM(config).eval()
    prompt = torch.randint(1, SMALL["vocab_size"], (2, 5), generator=torch.Generator().manual_seed(5))
    eager = model.generate(prompt, max_new_tokens=6, do_sample=False)
    static = model.generate(prompt, max_new_tokens=6, do_sample=False, cache_implementation="static")
    torch._dynamo.reset()
    compile_config = CompileConfig(backend="eager", fullgraph=True, dynamic=False)
    compile_config._compile_all_devices = True  # transformers auto-compiles on accelerators only
    options = dict(max_new_tokens=6, do_sample=False, cache_implementation="static")
    compiled = model.generate(prompt, compile_config=compile_config, **options)
    assert torch.equal(static, eager) and torch.equal(compiled, eager)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0  # the decode really went through Dynamo


def test_torch_export_matches_eager():
    torch.manual_seed(0)
    model = DDLmHCForCausalLM(DDLmHCConfig(**SMALL, hc_streams=4)).eval()
    ids = torch.randint(0, SMALL["vocab_size"], (2, 6), generator=torch.Generator().manual_seed(6))
    exported = torch.export.export(model, args=(), kwargs={"input_ids": ids, "use_cache": False})
    torch.testing.assert_close(exported.module()(input_ids=ids, use_cache=False).logits, model(ids).logits)


def test_hidden_states_follow_the_causal_lm_contract_and_stream_states_have_their_own_flag():
    """hidden_states: num_hidden_layers + 1 tensors (batch, seq, hidden), equal to Llama's at n = 1;
    the 4-D stream states come with output_stream_states=True."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from geoformers import convert_llama_to_ddl_mhc

    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(**SMALL)).eval()
    ids = torch.randint(0, SMALL["vocab_size"], (2, 6), generator=torch.Generator().manual_seed(8))
    converted = convert_llama_to_ddl_mhc(llama).eval()
    with torch.no_grad():
        expected = llama(ids, output_hidden_states=True).hidden_states
        actual = converted(ids, output_hidden_states=True).hidden_states
    assert len(actual) == len(expected) == SMALL["num_hidden_layers"] + 1
    for mine, theirs in zip(actual, expected, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0)

    model = DDLmHCForCausalLM(DDLmHCConfig(**SMALL, hc_streams=4)).eval()
    with torch.no_grad():
        out = model(ids, output_hidden_states=True, output_stream_states=True)
        plain = model(ids)
    assert [h.shape for h in out.hidden_states] == [(2, 6, SMALL["hidden_size"])] * 3
    assert [x.shape for x in out.stream_states] == [(2, 6, 4, SMALL["hidden_size"])] * 3
    torch.testing.assert_close(out.hidden_states[-1], model.model(ids).last_hidden_state)
    torch.testing.assert_close(out.hidden_states[0], model.model.stream_readout(out.stream_states[0]))
    assert plain.hidden_states is None and plain.stream_states is None
