"""The hyper-connection's host path (`ops/host_connection.py`; docs/ddl_mhc.md, 'Choosing a path'): its read
and write against the plain PyTorch references (`ops_path("naive")`) for every chart, mix and residual, the
rule that picks it, and decoding that gives the node's tokens."""

import copy
import json
import subprocess
import sys

import pytest
import torch
from script_modules import SCRIPTS

import geoformers
from geoformers.models.ddl_mhc import modeling_ddl_mhc
from geoformers.models.ddl_mhc.ops.dispatch import ops_path
from geoformers.models.ddl_mhc.ops.host_connection import HOST_MAX_ROWS, HOST_POINTS, host_rows


def connection(n: int, residual: str, dtype=torch.float64, seed: int = 0, **options):
    """A hyper-connection of width 16 whose parameters are all moved off their initial values, so every
    term of the maps (gates, biases, mix) is exercised."""
    torch.manual_seed(seed)
    config = geoformers.DDLmHCConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        hc_streams=n, residual=residual, delta_eps=0.3, **options,
    )  # fmt: skip
    layer = geoformers.DDLmHCForCausalLM(config).model.layers[0].attn_connection
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.add_(0.5 * torch.randn_like(parameter))
    return layer.to(dtype).eval()


def read_and_write(layer, streams, output):
    """(x_in, H_res, t_write, t_res, X', beta, k) of one sublayer, without a gradient."""
    with torch.no_grad():
        hidden, maps = layer.read(streams)
        updated, mixing = layer(streams, output, maps)
    return hidden, maps.h_res, maps.write_logit, maps.res_logit, updated, mixing.beta, mixing.direction


CASES = [
    (n, residual, chart, mix)
    for n in (2, 3, 4)
    for residual in ("delta", "add")
    for chart in ("rtbp", "tbp", "sinkhorn", "mhc_lite", "msrtbp", "stbp", "atbp")
    for mix in ("identity", "lazy")
] + [(4, "delta", "kromhc", "identity"), (5, "delta", "rtbp", "lazy"), (8, "add", "tbp", "identity")]


@pytest.mark.parametrize(("n", "residual", "chart", "mix"), CASES)
def test_the_host_path_is_the_plain_reference(n, residual, chart, mix):
    layer = connection(n, residual, hc_chart=chart, hc_res_mix=mix)
    streams = torch.randn(2, host_rows(n) // 2, n, 16, dtype=torch.float64)
    output = torch.randn(2, host_rows(n) // 2, 16, dtype=torch.float64)
    with ops_path("host"):
        host = read_and_write(layer, streams, output)
    with ops_path("naive"):
        naive = read_and_write(layer, streams, output)
    for got, expected in zip(host, naive, strict=True):
        if expected is None:
            assert got is None
            continue
        assert got.shape == expected.shape and got.dtype == expected.dtype
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)  # float64 on both paths


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_host_path_in_low_precision_is_the_node_to_rounding(dtype):
    layer = connection(4, "delta", dtype=dtype)
    streams = torch.randn(3, 1, 4, 16).to(dtype)
    output = torch.randn(3, 1, 16).to(dtype)
    with ops_path("host"):
        host = read_and_write(layer, streams, output)
    with ops_path("node"):
        node = read_and_write(layer, streams, output)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for got, expected in zip(host, node, strict=True):
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got.float(), expected.float(), rtol=tolerance, atol=tolerance)


@pytest.fixture
def host_calls(monkeypatch) -> list[int]:
    """The row counts of the host reads the model makes."""
    calls = []
    original = modeling_ddl_mhc.host_read

    def counted(layer, streams, record=True):
        calls.append(streams.shape[:-2].numel())
        return original(layer, streams, record)

    monkeypatch.setattr(modeling_ddl_mhc, "host_read", counted)
    return calls


def test_the_rule_takes_the_host_path_only_for_a_few_cpu_rows_without_a_gradient(host_calls):
    assert (host_rows(2), host_rows(3), host_rows(4), host_rows(8), host_rows(12), host_rows(13)) == (
        HOST_MAX_ROWS, HOST_MAX_ROWS, HOST_POINTS // 9, 2, 1, 0,
    )  # fmt: skip
    layer = connection(4, "delta", dtype=torch.float32)
    output = torch.randn(1, 16)
    most = host_rows(4)
    with torch.no_grad():
        layer.read(torch.randn(2, most // 2, 4, 16))  # the most rows, in two sequences
        layer.read(torch.randn(1, most + 1, 4, 16))  # more: the node
        layer.read(torch.randn(0, 1, 4, 16))  # no rows: the node
        with ops_path("node"):
            layer.read(torch.randn(1, 4, 16))
        with ops_path("naive"):
            layer.read(torch.randn(1, 4, 16))
        with ops_path("host"):
            layer.read(torch.randn(40, 4, 16))  # any row count when asked
    hidden, maps = layer.read(torch.randn(1, 4, 16))  # a gradient: the node
    assert hidden.grad_fn is not None and layer(torch.randn(1, 4, 16), output, maps)[0].grad_fn is not None
    with torch.no_grad():
        for other in (connection(1, "delta"), connection(4, "add", hc_dynamic=False)):  # no host path
            other.read(torch.randn(1, other.num_streams, 16, dtype=torch.float64))
        compiled = torch.compile(layer.read, backend="eager", fullgraph=True)
        compiled(torch.randn(1, 4, 16))  # traced: the node
    assert host_calls == [most, 40]


def test_a_jit_trace_records_the_node_not_the_host_paths_constants(host_calls):
    layer = connection(4, "delta", dtype=torch.float32).requires_grad_(False)  # a traced function's constants

    def sublayer(streams, output):
        _, maps = layer.read(streams)
        return layer(streams, output, maps)[0]

    with torch.no_grad():
        traced = torch.jit.trace(sublayer, (torch.randn(1, 4, 16), torch.randn(1, 16)), check_trace=False)
        streams, output = torch.randn(1, 4, 16), torch.randn(1, 16)  # other values than the trace saw
        torch.testing.assert_close(traced(streams, output), sublayer(streams, output), rtol=1e-5, atol=1e-5)
    assert host_calls == [1]  # the eager call only


def decoding_model(residual: str = "delta") -> geoformers.DDLmHCForCausalLM:
    """A small DDL-mHC causal LM whose hyper-connections are moved off their initial values."""
    torch.manual_seed(0)
    config = geoformers.DDLmHCConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        hc_streams=4, residual=residual,
    )  # fmt: skip
    model = geoformers.DDLmHCForCausalLM(config).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, modeling_ddl_mhc.HyperConnection):
                for parameter in module.parameters():
                    parameter.add_(0.3 * torch.randn_like(parameter))
    return model


@pytest.mark.parametrize("residual", ["delta", "add"])
def test_greedy_decoding_and_continuous_batching_give_the_nodes_tokens(residual, host_calls):
    model = decoding_model(residual)
    prompts = torch.randint(0, 64, (3, 6))
    with torch.no_grad():
        host = model.generate(prompts, max_new_tokens=10, do_sample=False)
        assert host_calls and set(host_calls) == {3}  # every decoding step, 3 rows; the 18-row prompt: node
        with ops_path("node"):
            node = model.generate(prompts, max_new_tokens=10, do_sample=False)
            logits_node = model(host[:, -5:]).logits
        logits_host = model(host[:, -5:]).logits  # 15 rows: host
    assert torch.equal(host, node)
    torch.testing.assert_close(logits_host, logits_node, rtol=0, atol=1e-5)


def test_an_unrecorded_host_write_updates_the_streams_alike_and_leaves_the_record_empty():
    for residual in ("delta", "add"):
        layer = connection(4, residual)
        streams = torch.randn(2, 3, 4, 16, dtype=torch.float64)
        output = torch.randn(2, 3, 16, dtype=torch.float64)
        with torch.no_grad(), ops_path("host"):
            recorded, maps = layer.read(streams)
            bare, bare_maps = layer.read(streams, record=False)
            written, mixing = layer(streams, output, maps)
            bare_written, bare_mixing = layer(streams, output, bare_maps)
        assert torch.equal(bare, recorded) and torch.equal(bare_written, written)
        assert maps.h_res is not None and (mixing.beta is not None) == (residual == "delta")
        assert bare_maps.h_res is bare_maps.write_logit is bare_maps.res_logit is None
        assert bare_mixing == (None, None, None, None)


@pytest.mark.parametrize("observer", ["output_mixing", "hook"])
def test_a_decoding_step_fills_the_record_where_something_reads_it(observer):
    """The decoder layer asks for the host path's record only when a hook can see it: transformers' output
    capture (`output_mixing=True`) or a hook of the user's; the record equals the node's."""
    model = decoding_model()
    prompt = torch.randint(0, 64, (1, 6))
    connection = model.model.layers[1].mlp_connection
    assert not connection.observed()
    seen = []
    with torch.no_grad():
        cache = model(prompt[:, :5], use_cache=True).past_key_values
        if observer == "hook":
            connection.register_forward_hook(lambda module, args, output: seen.append(output[1]))
        records = {}
        for path in ("host", "node"):
            with ops_path(path):
                step = model(
                    prompt[:, 5:],
                    cache=copy.deepcopy(cache),
                    output_mixing=observer == "output_mixing",
                )
            records[path] = step.mixing[-1] if observer == "output_mixing" else seen[-1]
    assert connection.observed()
    for got, expected in zip(records["host"], records["node"], strict=True):
        assert got is not None
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_lora_adapter_on_the_maps_projection_acts_on_the_host_path():
    peft = pytest.importorskip("peft")
    layer = connection(4, "delta", dtype=torch.float32)
    adapted = peft.get_peft_model(layer, peft.LoraConfig(r=2, target_modules=["maps_proj", "value_proj"]))
    for name, parameter in adapted.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.5)  # a trained adapter: B is no longer 0
    streams, output = torch.randn(2, 4, 16), torch.randn(2, 16)
    with ops_path("host"):
        host = read_and_write(adapted.base_model.model, streams, output)
    with ops_path("naive"):
        naive = read_and_write(adapted.base_model.model, streams, output)
        with adapted.disable_adapter():
            plain = read_and_write(adapted.base_model.model, streams, output)
    for got, expected in zip(host, naive, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(host[0], plain[0]) and not torch.allclose(host[4], plain[4])


@pytest.mark.parametrize("change", ["hook", "forward"])
@pytest.mark.parametrize("name", ["value_proj", "maps_proj"])
def test_a_hooked_or_replaced_projection_acts_on_the_host_path(change, name):
    """The host path runs `F.linear` itself (and the delta write folds `value_proj` into its own product) only
    while calling the module would run `F.linear` alone; with a hook or a replaced `forward` (accelerate's
    offloading) it calls the module."""
    layer, unchanged = connection(4, "delta"), connection(4, "delta")  # the same parameters
    projection = layer.delta.value_proj if name == "value_proj" else layer.maps_proj
    if change == "hook":
        projection.register_forward_hook(lambda module, args, output: 2.0 * output)
    else:
        plain = projection.forward
        projection.forward = lambda hidden: 2.0 * plain(hidden)
    streams = torch.randn(2, 3, 4, 16, dtype=torch.float64)
    output = torch.randn(2, 3, 16, dtype=torch.float64)
    with ops_path("host"):
        host = read_and_write(layer, streams, output)
        before = read_and_write(unchanged, streams, output)
    with ops_path("naive"):
        naive = read_and_write(layer, streams, output)
    for got, expected in zip(host, naive, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    assert not torch.allclose(host[4], before[4])  # the doubled values changed the write


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_streams_are_refused_on_the_host_path_as_on_the_node(bad):
    layer = connection(4, "delta", dtype=torch.float32)
    streams = torch.randn(1, 4, 16)
    streams[0, 2, 3] = bad
    for path in ("host", "node"):
        with torch.no_grad(), ops_path(path), pytest.raises(ValueError, match="NaN or infinite"):
            layer.read(streams)


def test_a_decoded_row_costs_the_host_path_fewer_tensor_ops_than_the_node():
    """The host path's point: per-token maps in Python floats, so a row takes few dispatched tensor ops."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += 1
            return func(*args, **(kwargs or {}))

    layer = connection(4, "delta", dtype=torch.float32)
    streams, output = torch.randn(1, 1, 4, 16), torch.randn(1, 1, 16)
    counts = {}
    for path in ("host", "node"):
        with torch.no_grad(), ops_path(path), Count() as counter:
            read_and_write(layer, streams, output)
        counts[path] = counter.count
    assert counts["host"] <= 50 and counts["host"] < 0.7 * counts["node"], counts


def test_the_crossing_benchmark_writes_host_and_node_times(tmp_path):
    command = [
        *(sys.executable, str(SCRIPTS / "bench_decode.py"), "--host_crossing", "--threads", "1"),
        *("--widths", "64", "--reps", "1", "--host_streams", "2", "4", "--host_rows", "1", "3"),
        *("--host_calls", "2", "--output_dir", str(tmp_path)),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads((tmp_path / "bench_decode_host.json").read_text())["sublayer"]
    assert [(row["streams"], row["rows"]) for row in rows] == [(2, 1), (2, 3), (4, 1), (4, 3)]
    for row in rows:
        assert row["host_us"] > 0 and row["ratio"] == pytest.approx(row["node_us"] / row["host_us"])
