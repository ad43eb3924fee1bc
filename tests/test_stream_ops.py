"""The stream ops (`modeling/ops/stream_read/`, `modeling/ops/stream_write/`): every autograd node called
directly against its naive reference function (outputs and gradients, float64 to rounding and float32 to
1e-5), and each dispatcher's choice of path. The Triton kernels are compared with the same naive functions
in tests/test_triton_kernels.py. On a GPU the nodes run on CUDA tensors, so a wrong node fails there too.
"""

import pytest
import torch
from torch import nn

from geoformers.modeling.ops.dispatch import force_triton, interpreter_enabled, triton_available
from geoformers.modeling.ops.stream_read import read_streams, stream_maps_read
from geoformers.modeling.ops.stream_read.naive import map_terms, naive_read_streams, naive_stream_maps
from geoformers.modeling.ops.stream_read.node import StreamMapsRead, StreamRead
from geoformers.modeling.ops.stream_write import delta_write, mix_and_write
from geoformers.modeling.ops.stream_write.naive import (
    naive_delta_amplitudes,
    naive_delta_write,
    naive_mix_and_write,
)
from geoformers.modeling.ops.stream_write.node import AddMixWrite, DeltaMixWrite

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BATCH, N, D = (2, 3), 4, 6
TOLERANCES = {torch.float64: 1e-12, torch.float32: 1e-5}

pytestmark = pytest.mark.usefixtures("single_thread")


def _operands(dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    """One sublayer's operands: streams X in `dtype`, per-token maps in float32 (float64 with float64 X)."""
    generator = torch.Generator().manual_seed(seed)
    maps = torch.promote_types(dtype, torch.float32)

    def draw(*shape, low=-1.0, high=1.0, of=maps):
        values = low + (high - low) * torch.rand(*shape, dtype=torch.float64, generator=generator)
        return values.to(device=DEVICE, dtype=of)

    return {
        "streams": draw(*BATCH, N, D, of=dtype),
        "weights": torch.softmax(draw(*BATCH, N), -1),
        "h_res": torch.softmax(draw(*BATCH, N, N), -1),
        "amplitudes": draw(*BATCH, N),
        "output": draw(*BATCH, D, of=dtype),
        "direction": torch.nn.functional.normalize(draw(*BATCH, D), dim=-1),
        "beta": draw(*BATCH, 1, low=0.0, high=2.0),
        "value": draw(*BATCH, N),
        "weight": draw(9, N * D, of=dtype),
        "pre_bias": draw(N),
        "pre_gate": draw((), low=0.1, high=0.9),
    }


def _compare(fast, naive, operands: dict, names: tuple[str, ...], dtype: torch.dtype) -> None:
    """fast(*inputs) and naive(*inputs) on the same leaves: every output and every input gradient (of a
    random projection of the outputs) to the dtype's tolerance, relative to the largest entry."""
    tolerance = TOLERANCES[dtype]
    results = []
    for function in (fast, naive):
        inputs = [operands[name].clone().requires_grad_() for name in names]
        outputs = function(*inputs)
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
        generator = torch.Generator().manual_seed(7)
        loss = sum(
            (out.double() * torch.randn(out.shape, dtype=torch.float64, generator=generator).to(DEVICE)).sum()
            for out in outputs
        )
        results.append((outputs, torch.autograd.grad(loss, inputs)))
    (fast_out, fast_grads), (naive_out, naive_grads) = results
    for label, mine, theirs in [
        *((f"output {i}", a, b) for i, (a, b) in enumerate(zip(fast_out, naive_out, strict=True))),
        *((f"gradient of {name}", a, b) for name, a, b in zip(names, fast_grads, naive_grads, strict=True)),
    ]:
        assert mine.shape == theirs.shape and mine.dtype == theirs.dtype, label
        scale = theirs.detach().abs().max().double().clamp_min(1.0)
        error = (mine.detach().double() - theirs.detach().double()).abs().max() / scale
        assert error <= tolerance, f"{label}: relative error {float(error):.3g} > {tolerance:g}"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_stream_read_node_equals_naive(dtype):
    _compare(StreamRead.apply, naive_read_streams, _operands(dtype), ("weights", "streams"), dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_stream_maps_read_node_equals_naive(dtype):
    """z and x_in of `StreamMapsRead` against `naive_stream_maps` + `naive_read_streams` with the same W."""
    eps = 1e-3

    def node(streams, weight, pre_bias, pre_gate):
        return StreamMapsRead.apply(streams, weight, pre_bias, pre_gate, eps)

    def naive(streams, weight, pre_bias, pre_gate):
        terms, weights = naive_stream_maps(streams, lambda flat: flat @ weight.T, pre_bias, pre_gate, eps)
        return terms, naive_read_streams(weights, streams)

    names = ("streams", "weight", "pre_bias", "pre_gate")
    _compare(node, naive, _operands(dtype, seed=1), names, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_add_mix_write_node_equals_naive(dtype):
    names = ("h_res", "streams", "amplitudes", "output")
    _compare(AddMixWrite.apply, naive_mix_and_write, _operands(dtype, seed=2), names, dtype)


@pytest.mark.parametrize("identity", [False, True], ids=["mixed", "identity"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_delta_mix_write_node_equals_naive(dtype, identity):
    """X' and s of `DeltaMixWrite` against `naive_delta_write` and `naive_delta_amplitudes`, per-token
    H_res or None (identity) and a per-token or one shared beta."""
    operands = _operands(dtype, seed=3)
    for beta in (operands["beta"], operands["beta"][0, 0]):
        operands["shared_beta"] = beta

        def node(streams, direction, beta, value, h_res=None):
            updated, amplitudes = DeltaMixWrite.apply(h_res, streams, direction, beta, value)
            return updated, amplitudes.detach()  # s is marked non-differentiable

        def naive(streams, direction, beta, value, h_res=None):
            amplitudes = naive_delta_amplitudes(h_res, streams, direction, beta, value).detach()
            return naive_delta_write(h_res, streams, direction, beta, value), amplitudes

        names = ("streams", "direction", "shared_beta", "value") + (() if identity else ("h_res",))
        _compare(node, naive, operands, names, dtype)


def test_naive_delta_write_hand_computed():
    """n = 1, d = 2 (DDL eq. 3.7): x = (3, 4), k = (1, 0), beta = 0.5, v = 1 -> x' = (3 + 0.5 (1 - 3), 4)."""
    x = torch.tensor([[[3.0, 4.0]]])
    k, beta, v = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.5]]), torch.tensor([[1.0]])
    assert naive_delta_write(None, x, k, beta, v).tolist() == [[[2.0, 4.0]]]
    assert naive_delta_amplitudes(None, x, k, beta, v).tolist() == [[-1.0]]


# ----------------------------------------------------------------------------------------------
# Dispatchers


def _node_name(tensor: torch.Tensor) -> str:
    return type(tensor.grad_fn).__name__


def _graph_names(tensor: torch.Tensor) -> set[str]:
    """The class names of the autograd nodes behind `tensor`."""
    names, seen, todo = set(), set(), [tensor.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and id(node) not in seen:
            seen.add(id(node))
            names.add(type(node).__name__)
            todo.extend(next_node for next_node, _ in node.next_functions)
    return names


def test_dispatchers_take_the_naive_path_for_reference_and_the_node_for_fused():
    """ "reference" returns the naive function's value and graph; "fused" the autograd node (CPU, eager),
    or its forward alone without gradients. Both give the naive value."""
    ops = _operands(torch.float32, seed=4)
    leaves = {name: value.clone().requires_grad_() for name, value in ops.items()}
    x, h, k, beta, v = (leaves[name] for name in ("streams", "h_res", "direction", "beta", "value"))
    cases = [
        (read_streams, (leaves["weights"], x), naive_read_streams, "StreamReadBackward"),
        (
            mix_and_write,
            (h, x, leaves["amplitudes"], leaves["output"]),
            naive_mix_and_write,
            "AddMixWriteBackward",
        ),
        (delta_write, (h, x, k, beta, v), naive_delta_write, "DeltaMixWriteBackward"),
    ]
    for dispatcher, args, naive, node in cases:
        expected = naive(*args)
        reference = dispatcher(*args, "reference")
        assert torch.equal(reference, expected) and _node_name(reference) == _node_name(expected)
        if DEVICE == "cpu":
            fused = dispatcher(*args, "fused")
            assert _node_name(fused) == node
            torch.testing.assert_close(fused, expected, rtol=0, atol=1e-6)
            with torch.no_grad():
                assert dispatcher(*args, "fused").grad_fn is None
        with pytest.raises(ValueError, match="implementation"):
            dispatcher(*args, "triton")


def test_fused_dispatchers_expand_static_maps_and_identity_mixing():
    """A static (n,) read, a static (n, n) H_res with (n,) amplitudes, and H_res = None give the naive
    values through the fused paths."""
    ops = _operands(torch.float64, seed=5)
    x, k, beta, v = ops["streams"], ops["direction"], ops["beta"], ops["value"]
    weights, h_res, amplitudes = ops["weights"][0, 0], ops["h_res"][0, 0], ops["amplitudes"][0, 0]
    for implementation in ("fused", "reference"):
        got = read_streams(weights, x, implementation)
        torch.testing.assert_close(got, naive_read_streams(weights, x), rtol=0, atol=1e-12)
        for mixing in (h_res, None):
            got = mix_and_write(mixing, x, amplitudes, ops["output"], implementation)
            expected = naive_mix_and_write(mixing, x, amplitudes, ops["output"])
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
            got = delta_write(mixing, x, k, beta, v, implementation)
            torch.testing.assert_close(got, naive_delta_write(mixing, x, k, beta, v), rtol=0, atol=1e-12)


class _WrappedLinear(nn.Module):
    """A projection that is not a plain `nn.Linear` (as PEFT's LoRA layer is): W x + s (A x)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.base_layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        self.base_layer.weight.data.copy_(weight)
        self.adapter = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        nn.init.normal_(self.adapter.weight, std=0.1, generator=torch.Generator().manual_seed(0))

    def forward(self, flat: torch.Tensor) -> torch.Tensor:
        return self.base_layer(flat) + 0.5 * self.adapter(flat)


def test_stream_maps_read_fuses_a_plain_linear_and_calls_any_other_projection():
    """With an `nn.Linear` the fused path is one `StreamMapsRead` node; a wrapped projection is called as it
    is, so its adapter gets the gradient the naive path gives it."""
    ops = _operands(torch.float64, seed=6)
    x, pre_bias, pre_gate = ops["streams"].requires_grad_(), ops["pre_bias"], ops["pre_gate"]
    linear = nn.Linear(N * D, 9, bias=False).to(DEVICE, torch.float64)
    linear.weight.data.copy_(ops["weight"])
    terms, hidden = stream_maps_read(x, linear, pre_bias, pre_gate, 1e-3, "fused")
    assert _node_name(terms) == "StreamMapsReadBackward"
    naive_terms, weights = naive_stream_maps(x, linear, pre_bias, pre_gate, 1e-3)
    torch.testing.assert_close(terms, naive_terms, rtol=0, atol=1e-12)
    torch.testing.assert_close(hidden, naive_read_streams(weights, x), rtol=0, atol=1e-12)
    torch.testing.assert_close(map_terms(x, linear, 1e-3), naive_terms, rtol=0, atol=0)

    wrapped = _WrappedLinear(ops["weight"].cpu()).to(DEVICE, torch.float64)
    grads = {}
    for implementation in ("fused", "reference"):
        terms, hidden = stream_maps_read(x, wrapped, pre_bias, pre_gate, 1e-3, implementation)
        loss = terms.square().sum() + hidden.sin().sum()
        grads[implementation] = torch.autograd.grad(loss, [x, wrapped.adapter.weight])
    for fused, reference in zip(grads["fused"], grads["reference"], strict=True):
        assert fused.abs().max() > 0
        torch.testing.assert_close(fused, reference, rtol=0, atol=1e-12)


@pytest.mark.skipif(
    DEVICE != "cpu" or not triton_available() or not interpreter_enabled(),
    reason="needs triton and TRITON_INTERPRET=1 (tests/conftest.py sets it without a GPU)",
)
def test_fused_dispatchers_take_the_kernels_inside_force_triton_but_not_for_float64():
    ops = _operands(torch.float32, seed=8)
    x, h, k, beta, v = (
        ops[name].requires_grad_() for name in ("streams", "h_res", "direction", "beta", "value")
    )
    with force_triton():
        calls = [
            read_streams(ops["weights"], x, "fused"),
            mix_and_write(h, x, ops["amplitudes"], ops["output"], "fused"),
            delta_write(h, x, k, beta, v, "fused"),
        ]
        kernels = ["_ReadBackward", "_WriteBackward", "_DeltaWriteBackward"]
        for out, kernel in zip(calls, kernels, strict=True):
            assert kernel in _graph_names(out)
        expected = [
            naive_read_streams(ops["weights"], x),
            naive_mix_and_write(h, x, ops["amplitudes"], ops["output"]),
            naive_delta_write(h, x, k, beta, v),
        ]
        for got, want in zip(calls, expected, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        double = x.detach().double()
        assert _node_name(read_streams(ops["weights"].double(), double.requires_grad_(), "fused")) == (
            "StreamReadBackward"
        )
        assert _node_name(delta_write(h.double(), double, k, beta, v, "fused")) == "DeltaMixWriteBackward"
