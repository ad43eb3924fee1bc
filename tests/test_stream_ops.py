"""The stream ops (DDL-mHC's `ops/stream_read/`, `ops/stream_write/`): every autograd node called
directly against its naive reference function (outputs and gradients, float64 to rounding and float32 to
1e-5), and the path each op function takes by the one rule (`ops/dispatch.py`). The Triton kernels are
compared with the same naive functions in tests/test_triton_kernels.py. On a GPU the nodes run on CUDA
tensors (inside `ops_path("node")`), so a wrong node fails there too.
"""

import pytest
import torch
from torch import nn

from geoformers.models.ddl_mhc.ops.dispatch import interpreter_enabled, ops_path, triton_available
from geoformers.models.ddl_mhc.ops.stream_read import read_streams
from geoformers.models.ddl_mhc.ops.stream_read.naive import map_terms, naive_read_streams, naive_stream_maps
from geoformers.models.ddl_mhc.ops.stream_read.node import StreamMapsRead, StreamRead
from geoformers.models.ddl_mhc.ops.stream_write import write_streams
from geoformers.models.ddl_mhc.ops.stream_write.naive import (
    naive_delta_amplitudes,
    naive_delta_write,
    naive_mix_and_write,
)
from geoformers.models.ddl_mhc.ops.stream_write.node import AddMixWrite, DeltaMixWrite

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
    """z and x_in of `StreamMapsRead` against `naive_stream_maps` + `naive_read_streams` after the same
    projection vec(X) W^T (whose own backward autograd adds in both)."""
    eps = 1e-3

    def node(streams, weight, pre_bias, pre_gate):
        return StreamMapsRead.apply(streams, streams.flatten(-2) @ weight.T, pre_bias, pre_gate, eps)

    def naive(streams, weight, pre_bias, pre_gate):
        terms, weights = naive_stream_maps(streams, streams.flatten(-2) @ weight.T, pre_bias, pre_gate, eps)
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
# The op functions: the path of the one rule


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


def _op_cases(ops: dict) -> list:
    """(op call, naive call, the node's backward name) of the static read, the dynamic read (after the
    projection), the add write and the delta write, on the operands `ops` (leaves)."""
    x, h, k, beta, v = (ops[name] for name in ("streams", "h_res", "direction", "beta", "value"))
    bias, gate, weight, amplitudes = ops["pre_bias"], ops["pre_gate"], ops["weight"], ops["amplitudes"]

    def naive_maps_read():
        terms, weights = naive_stream_maps(x, x.flatten(-2) @ weight.T, bias, gate, 1e-3)
        return terms, naive_read_streams(weights, x)

    return [
        (
            lambda: read_streams(x, bias)[1],
            lambda: naive_read_streams(torch.softmax(bias, -1), x),
            "StreamReadBackward",
        ),
        (
            lambda: read_streams(x, bias, gate, x.flatten(-2) @ weight.T, 1e-3),
            naive_maps_read,
            "StreamMapsReadBackward",
        ),
        (
            lambda: write_streams(h, x, ops["output"], amplitudes),
            lambda: naive_mix_and_write(h, x, amplitudes, ops["output"]),
            "AddMixWriteBackward",
        ),
        (
            lambda: write_streams(h, x, k, beta=beta, value=v),
            lambda: naive_delta_write(h, x, k, beta, v),
            "DeltaMixWriteBackward",
        ),
    ]


def test_op_functions_take_the_node_or_inside_ops_path_naive_the_reference():
    """Without a kernel (CPU tensors; inside `ops_path("node")` on CUDA) each op function is its autograd
    node, or the node's forward alone without gradients; inside `ops_path("naive")` it is the naive function,
    value and graph. Both give the naive value."""
    ops = _operands(torch.float32, seed=4)
    leaves = {name: value.clone().requires_grad_() for name, value in ops.items()}
    for op, naive, node in _op_cases(leaves):
        expected = naive()
        with ops_path("naive"):
            reference = op()
        for mine, theirs in zip(
            *((out,) if isinstance(out, torch.Tensor) else out for out in (reference, expected)), strict=True
        ):
            assert torch.equal(mine, theirs) and _node_name(mine) == _node_name(theirs)
        with ops_path("node"):
            fused = op()
            with torch.no_grad():
                alone = op()
        fused, alone = ((out,) if isinstance(out, torch.Tensor) else out for out in (fused, alone))
        expected = (expected,) if isinstance(expected, torch.Tensor) else expected
        assert _node_name(fused[-1]) == node
        for mine, plain, theirs in zip(fused, alone, expected, strict=True):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-6)
            assert plain.grad_fn is None and torch.equal(plain, mine.detach())


def test_op_functions_expand_static_maps_and_identity_mixing():
    """A static (n,) read, a static (n, n) H_res with (n,) amplitudes, and H_res = None give the naive
    values on the node path."""
    ops = _operands(torch.float64, seed=5)
    x, k, beta, v = ops["streams"], ops["direction"], ops["beta"], ops["value"]
    h_res, amplitudes = ops["h_res"][0, 0], ops["amplitudes"][0, 0]
    with ops_path("node"):
        terms, got = read_streams(x, ops["pre_bias"])
        assert terms is None
        expected = naive_read_streams(torch.softmax(ops["pre_bias"], -1), x)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
        for mixing in (h_res, None):
            got = write_streams(mixing, x, ops["output"], amplitudes)
            expected = naive_mix_and_write(mixing, x, amplitudes, ops["output"])
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
            got = write_streams(mixing, x, k, beta=beta, value=v)
            torch.testing.assert_close(got, naive_delta_write(mixing, x, k, beta, v), rtol=0, atol=1e-12)


def test_op_functions_name_a_missing_or_mixed_argument():
    ops = _operands(torch.float32, seed=9)
    x, h, k = ops["streams"], ops["h_res"], ops["direction"]
    with pytest.raises(TypeError, match="either `amplitudes` .* or both `beta` and `value`"):
        write_streams(h, x, k)
    with pytest.raises(TypeError, match="either `amplitudes`"):
        write_streams(h, x, k, ops["amplitudes"], beta=ops["beta"], value=ops["value"])
    with pytest.raises(TypeError, match="both `beta` and `value`"):
        write_streams(h, x, k, beta=ops["beta"])
    with pytest.raises(TypeError, match="need `pre_gate`"):
        read_streams(x, ops["pre_bias"], projected=x.flatten(-2) @ ops["weight"].T)


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


def test_a_wrapped_projection_keeps_the_fused_read():
    """The projection runs first, as a module, so a wrapped (LoRA-like) one takes the same `StreamMapsRead`
    node as a plain `nn.Linear`, and its adapter gets the gradient the naive path gives it."""
    ops = _operands(torch.float64, seed=6)
    x, pre_bias, pre_gate = ops["streams"].requires_grad_(), ops["pre_bias"], ops["pre_gate"]
    linear = nn.Linear(N * D, 9, bias=False).to(DEVICE, torch.float64)
    linear.weight.data.copy_(ops["weight"])
    naive_terms, _ = naive_stream_maps(x, linear(x.flatten(-2)), pre_bias, pre_gate, 1e-3)
    torch.testing.assert_close(map_terms(x, linear(x.flatten(-2)), 1e-3), naive_terms, rtol=0, atol=0)

    wrapped = _WrappedLinear(ops["weight"].cpu()).to(DEVICE, torch.float64)
    grads = {}
    for path in ("node", "naive"):
        with ops_path(path):
            terms, hidden = read_streams(x, pre_bias, pre_gate, wrapped(x.flatten(-2)), 1e-3)
        if path == "node":
            assert _node_name(terms) == "StreamMapsReadBackward"
        loss = terms.square().sum() + hidden.sin().sum()
        grads[path] = torch.autograd.grad(loss, [x, wrapped.adapter.weight])
    for fused, reference in zip(grads["node"], grads["naive"], strict=True):
        assert fused.abs().max() > 0
        torch.testing.assert_close(fused, reference, rtol=0, atol=1e-12)


@pytest.mark.skipif(
    DEVICE != "cpu" or not triton_available() or not interpreter_enabled(),
    reason="needs triton and TRITON_INTERPRET=1 (tests/conftest.py sets it without a GPU)",
)
def test_op_functions_take_the_kernels_inside_ops_path_triton_but_not_for_float64():
    """Inside `ops_path("triton")` the ops run the kernels on CPU tensors (the dynamic read after the
    projection too), with the naive values; float64 streams take the nodes (the kernels accumulate in
    float32)."""
    ops = _operands(torch.float32, seed=8)
    leaves = {name: value.clone().requires_grad_() for name, value in ops.items()}
    kernels = ["_ReadBackward", "_ReadBackward", "_WriteBackward", "_DeltaWriteBackward"]
    with ops_path("triton"):
        for (op, naive, _), kernel in zip(_op_cases(leaves), kernels, strict=True):
            got, want = op(), naive()
            got, want = ((out,) if isinstance(out, torch.Tensor) else out for out in (got, want))
            assert kernel in _graph_names(got[-1])
            for mine, theirs in zip(got, want, strict=True):
                torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5)
        double = {name: value.double() for name, value in leaves.items()}
        nodes = [
            "StreamReadBackward",
            "StreamMapsReadBackward",
            "AddMixWriteBackward",
            "DeltaMixWriteBackward",
        ]
        for (op, _, _), node in zip(_op_cases(double), nodes, strict=True):
            out = op()
            assert _node_name(out if isinstance(out, torch.Tensor) else out[-1]) == node
