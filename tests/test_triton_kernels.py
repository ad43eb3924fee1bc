"""Triton kernels (`models/ddl_mhc/ops/charts/triton.py`, `models/ddl_mhc/ops/stream_read/triton.py`,
`models/ddl_mhc/ops/stream_write/triton.py`) against the plain PyTorch references.

Without a GPU the kernels run on CPU tensors in Triton's interpreter (TRITON_INTERPRET=1, set by
conftest.py before the kernel modules are imported); with one they run on CUDA tensors. Every kernel is
checked forward and backward (torch.autograd.grad of a random projection of the output) against a
float64 evaluation of the reference: float32 to 1e-6, bfloat16 to bfloat16 rounding.
"""

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (pip install 'geoformers[triton]')")

from geoformers.models.ddl_mhc.ops.charts import birkhoff, ds_violation, naive  # noqa: E402
from geoformers.models.ddl_mhc.ops.charts import triton as chart_kernels  # noqa: E402
from geoformers.models.ddl_mhc.ops.dispatch import STREAM_DTYPES, choose_path, ops_path  # noqa: E402
from geoformers.models.ddl_mhc.ops.stream_read import triton as read_kernels  # noqa: E402
from geoformers.models.ddl_mhc.ops.stream_read.naive import naive_read_streams  # noqa: E402
from geoformers.models.ddl_mhc.ops.stream_read.triton import triton_read_streams  # noqa: E402
from geoformers.models.ddl_mhc.ops.stream_write import triton as write_kernels  # noqa: E402
from geoformers.models.ddl_mhc.ops.stream_write.naive import naive_delta_write, naive_mix_and_write  # noqa: E402
from geoformers.models.ddl_mhc.ops.stream_write.triton import triton_delta_write, triton_mix_and_write  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and type(read_kernels._read_forward_kernel).__name__ != "InterpretedFunction":
    pytest.skip(
        "no GPU and the kernels were compiled, not interpreted: TRITON_INTERPRET=1 must be set before "
        "the geoformers kernel modules are imported (tests/conftest.py sets it unless it is set to 0)",
        allow_module_level=True,
    )


def _grads(output: torch.Tensor, inputs: list[torch.Tensor], projection: torch.Tensor) -> tuple:
    return torch.autograd.grad((output.double() * projection).sum(), inputs)


def _assert_relative(actual: torch.Tensor, expected: torch.Tensor, tolerance: float, name: str) -> None:
    actual, expected = actual.detach().double(), expected.detach()
    error = float((actual - expected).abs().max())
    scale = max(float(expected.abs().max()), 1e-30)
    assert error <= tolerance * scale, f"{name}: max error {error:.3g} > {tolerance:g} * {scale:.3g}"


# ----------------------------------------------------------------------------------------------
# Charts: the Triton kernels called directly against the naive definitions (`ops/charts/naive.py`)

NAIVE = {
    "tbp": naive.tbp,
    "rtbp": naive.rtbp,
    "stbp": lambda t, n: naive.tbp(t, n, naive.ScaledChoice()),
    "srtbp": lambda t, n: naive.rtbp(t, n, naive.ScaledChoice()),
    "mstbp": lambda t, n: naive.tbp(t, n, naive.ScaledChoice(rho=naive.MARGIN_RHO)),
    "msrtbp": lambda t, n: naive.rtbp(t, n, naive.ScaledChoice(rho=naive.MARGIN_RHO)),
    "atbp": lambda t, n: naive.average(t, n, naive.tbp, ("direct", "reverse")),
}


def _dispatching():
    """What CUDA tensors get by default: the ops taking the Triton kernels (on CPU, the interpreter's)."""
    return ops_path("triton") if DEVICE == "cpu" else contextlib.nullcontext()


def _chart_case(method: str, n: int, logits: torch.Tensor) -> None:
    """Triton chart of float32 `logits` (..., k) vs the naive chart in float64: outputs to 1e-6,
    gradients to 1e-5 relative, and the result doubly stochastic to 1e-6 with entries >= 0."""
    fast_in = logits.reshape(-1, logits.shape[-1]).clone().requires_grad_()
    ref_in = logits.reshape(-1, logits.shape[-1]).double().requires_grad_()
    fast, ref = chart_kernels.triton_chart(fast_in, n, method), NAIVE[method](ref_in, n)
    assert fast.dtype == torch.float32 and fast.shape == (fast_in.shape[0], n, n)
    torch.testing.assert_close(fast.double(), ref, rtol=0, atol=1e-6)
    assert float(ds_violation(fast).max()) <= 1e-6
    assert bool((fast >= 0).all())
    projection = torch.randn(fast.shape, dtype=torch.float64, device=logits.device)
    (grad_fast,), (grad_ref,) = _grads(fast, [fast_in], projection), _grads(ref, [ref_in], projection)
    _assert_relative(grad_fast, grad_ref, 1e-5, f"{method} n={n} gradient")


@pytest.mark.parametrize("method", ["tbp", "rtbp"])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_chart_matches_reference(method, n):
    torch.manual_seed(n)
    _chart_case(method, n, 2.0 * torch.randn(3, 7, (n - 1) ** 2, device=DEVICE))


@pytest.mark.parametrize(
    ("method", "n"), [(m, 4) for m in ("stbp", "srtbp", "mstbp", "msrtbp")] + [("srtbp", 3), ("atbp", 3)]
)
def test_variant_chart_matches_reference(method, n):
    """The one kernel with the variants' interval choices (and the averaged orderings of atbp) against the
    naive charts with the same choice, at moderate and saturating logits."""
    torch.manual_seed(n)
    k = 2 * ((n - 1) ** 2 + 1) if method == "atbp" else (n - 1) ** 2
    _chart_case(
        method, n, torch.randn(2, 5, k, device=DEVICE) * torch.tensor([[[0.5]], [[8.0]]], device=DEVICE)
    )


@pytest.mark.parametrize("method", ["tbp", "rtbp"])
def test_chart_at_zero_logits_follows_the_reference_ties(method):
    """Zero logits (the model's initialisation) put TBP's first entries on ties r = c and c = D; the kernel
    takes the same branch of min / relu as `naive.py`, so the gradients agree there too."""
    _chart_case(method, 4, torch.zeros(5, 9, device=DEVICE))


@pytest.mark.parametrize("method", ["tbp", "rtbp"])
def test_chart_saturated_logits_stay_doubly_stochastic(method):
    logits = torch.tensor([[30.0, -30.0, 1e3, -1e3, 0.0, 50.0, -50.0, 5.0, -5.0]], device=DEVICE)
    _chart_case(method, 4, logits.repeat(4, 1) * torch.tensor([[1.0], [-1.0], [0.5], [2.0]], device=DEVICE))


@pytest.mark.parametrize("method", ["tbp", "rtbp"])
def test_chart_float64_gradcheck(method):
    """Float64 logits give a float64 chart whose backward passes finite differences (independent of the
    reference's backward), and whose value is the naive chart's to float64 rounding."""
    logits = torch.randn(2, 4, dtype=torch.float64, device=DEVICE, requires_grad=True)
    chart = chart_kernels.triton_chart
    assert torch.autograd.gradcheck(lambda t: chart(t, 3, method), (logits,), fast_mode=True)
    torch.testing.assert_close(chart(logits, 3, method), NAIVE[method](logits, 3), rtol=0, atol=1e-14)


def test_scaled_chart_float64_gradcheck():
    """The scaled choice's kernel derivatives (through the width inside the sigmoid) against finite
    differences, and its float64 value against the naive chart: the kernel computes with the float64 beta,
    eps, rho."""
    logits = torch.randn(2, 4, dtype=torch.float64, device=DEVICE, requires_grad=True)
    chart = chart_kernels.triton_chart
    assert torch.autograd.gradcheck(lambda t: chart(t, 3, "msrtbp"), (logits,), fast_mode=True)
    torch.testing.assert_close(chart(logits, 3, "mstbp"), NAIVE["mstbp"](logits, 3), rtol=0, atol=1e-14)


def test_dispatcher_runs_the_kernels(monkeypatch):
    """`birkhoff` sends tbp / rtbp to the Triton kernels (counted here); the results are the naive charts."""
    calls = []
    original = chart_kernels.triton_chart
    monkeypatch.setattr(
        chart_kernels, "triton_chart", lambda *a, **k: calls.append(a[2]) or original(*a, **k)
    )
    logits = torch.randn(2, 3, 9, device=DEVICE)
    with _dispatching():
        results = {method: birkhoff(logits, 4, method) for method in ("tbp", "rtbp")}
    assert calls == ["tbp", "rtbp"]
    for method, x in results.items():
        assert x.shape == (2, 3, 4, 4)
        expected = NAIVE[method](logits.reshape(6, 9).double(), 4).view(2, 3, 4, 4)
        torch.testing.assert_close(x.double(), expected, rtol=0, atol=1e-6)


def test_dispatcher_runs_every_variant_on_the_kernels(monkeypatch):
    """Every row of the chart table on a transport base (the interval variants and atbp) takes the kernels
    where tbp / rtbp do, and equals its naive chart."""
    calls = []
    original = chart_kernels.triton_chart
    monkeypatch.setattr(
        chart_kernels, "triton_chart", lambda *a, **k: calls.append(a[2]) or original(*a, **k)
    )
    variants = ("stbp", "srtbp", "mstbp", "msrtbp", "atbp")
    torch.manual_seed(1)
    logits = {m: torch.randn(3, 2 * (9 + 1) if m == "atbp" else 9, device=DEVICE) for m in variants}
    with _dispatching():
        results = {m: birkhoff(logits[m], 4, m) for m in variants}
    assert calls == list(variants)
    for method, x in results.items():
        assert x.dtype == torch.float32
        expected = NAIVE[method](logits[method].double(), 4)
        torch.testing.assert_close(x.double(), expected, rtol=0, atol=1e-6)


def test_dispatcher_bfloat16_logits_give_the_float32_chart():
    logits = torch.randn(6, 9, device=DEVICE).bfloat16()
    with _dispatching():
        for method in ("tbp", "rtbp"):
            x = birkhoff(logits, 4, method)
            assert x.dtype == torch.float32
            expected = NAIVE[method](logits.double(), 4)
            torch.testing.assert_close(x.double(), expected, rtol=0, atol=1e-6)


def test_dispatcher_ignores_autocast():
    """Under bfloat16 autocast the chart stays float32 and equal to the naive chart (autocast is off)."""
    logits = torch.randn(6, 9, device=DEVICE)
    with torch.autocast(device_type=DEVICE, dtype=torch.bfloat16), _dispatching():
        fast = birkhoff(logits, 4, "rtbp")
    assert fast.dtype == torch.float32
    torch.testing.assert_close(fast.double(), naive.rtbp(logits.double(), 4), rtol=0, atol=1e-6)


def test_dispatcher_n1_empty_and_bad_input_with_the_kernels():
    with pytest.raises(ValueError, match="method"):
        chart_kernels.triton_chart(torch.zeros(2, 9, device=DEVICE), 4, "sinkhorn")
    with _dispatching():
        assert torch.equal(
            birkhoff(torch.zeros(2, 0, device=DEVICE), 1, "rtbp"), torch.ones(2, 1, 1, device=DEVICE)
        )
        with pytest.raises(ValueError, match=r"expects logits of shape \(\.\.\., 9\)"):
            birkhoff(torch.zeros(2, 8, device=DEVICE), 4, "tbp")
        with pytest.raises(ValueError, match="floating dtype"):
            birkhoff(torch.zeros(2, 9, dtype=torch.long, device=DEVICE), 4, "tbp")
        with pytest.raises(ValueError, match="NaN or infinite"):
            birkhoff(torch.tensor([[0.0, float("nan"), 0.0, 0.0]], device=DEVICE), 3, "rtbp")
        with pytest.raises(TypeError, match="n must be an int"):
            birkhoff(torch.zeros(2, 9, device=DEVICE), 4.0, "tbp")
        assert birkhoff(torch.zeros(0, 3, 9, device=DEVICE), 4, "tbp").shape == (0, 3, 4, 4)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["tbp", "rtbp"])
@pytest.mark.parametrize("n", [5, 6, 7, 8, 16])
def test_chart_matches_reference_large(method, n):
    """More streams (odd, even, non-powers of two) and a batch that is no multiple of the kernel's block
    (32 to 4 lanes per block from n = 5 to 16; the interpreter makes n = 16 slow, so fewer there)."""
    torch.manual_seed(n)
    _chart_case(method, n, 3.0 * torch.randn(67 if n < 16 else 9, (n - 1) ** 2, device=DEVICE))


def test_chart_tables_sizes():
    """The schedule's tables have one interval point per logit, each logit used once, entries over
    1 + (n-1)^2 slots."""
    for method in ("tbp", "rtbp"):
        points, index, table = chart_kernels._tables(method, 5, torch.device("cpu"))
        assert points.shape[0] == 16 and sorted(index.tolist()) == list(range(16))
        assert table.shape == (25, 32) and bool((table[:, 17:] == 0).all())


# ----------------------------------------------------------------------------------------------
# Stream read and writes


def _inputs(batch: tuple[int, ...], n: int, d: int, static: bool) -> dict[str, torch.Tensor]:
    """float64 operands of one sublayer: maps per token or (static) one set for all tokens."""
    maps = () if static else batch
    options = {"dtype": torch.float64, "device": DEVICE}
    return {
        "streams": torch.randn(*batch, n, d, **options),
        "weights": torch.softmax(torch.randn(*maps, n, **options), -1),
        "h_res": torch.softmax(torch.randn(*maps, n, n, **options), -1),
        "amplitudes": torch.randn(*batch, n, **options),
        "output": torch.randn(*batch, d, **options),
        "direction": torch.nn.functional.normalize(torch.randn(*batch, d, **options), dim=-1),
        "beta": 2.0 * torch.rand(*maps, 1, **options) if maps else 2.0 * torch.rand(1, **options),
        "value": torch.randn(*batch, n, **options),
    }


KERNELS = {
    "read": (triton_read_streams, naive_read_streams, ("weights", "streams")),
    "add": (triton_mix_and_write, naive_mix_and_write, ("h_res", "streams", "amplitudes", "output")),
    "delta": (triton_delta_write, naive_delta_write, ("h_res", "streams", "direction", "beta", "value")),
}


def _stream_case(kind: str, n: int, d: int, dtype: torch.dtype, static: bool = False, block_d=None) -> None:
    """Kernel on float32 / bfloat16 operands vs the reference in float64 on the same (rounded) values.
    Streams and the sublayer output h are in `dtype`, the maps and gates float32, as in the model."""
    fast_fn, ref_fn, names = KERNELS[kind]
    values = _inputs((2, 3), n, d, static)
    low = {name: values[name].to(dtype if name in ("streams", "output") else torch.float32) for name in names}
    fast_in = [low[name].clone().requires_grad_() for name in names]
    ref_in = [low[name].double().requires_grad_() for name in names]
    fast, ref = fast_fn(*fast_in, block_d=block_d), ref_fn(*ref_in)
    assert fast.dtype == dtype and fast.shape == ref.shape
    projection = torch.randn(ref.shape, dtype=torch.float64, device=DEVICE)
    grads_fast, grads_ref = _grads(fast, fast_in, projection), _grads(ref, ref_in, projection)
    if dtype == torch.float32:
        _assert_relative(fast, ref, 1e-6, f"{kind} output")
        for name, grad_fast, grad_ref in zip(names, grads_fast, grads_ref, strict=True):
            assert grad_fast.dtype == torch.float32 and grad_fast.shape == grad_ref.shape
            _assert_relative(grad_fast, grad_ref, 1e-5, f"{kind} gradient of {name}")
    else:  # bfloat16 results: one rounding of the output (and of dL/dX' for the gradients)
        torch.testing.assert_close(fast.double(), ref, rtol=1.6e-2, atol=1e-2)
        for name, grad_fast, grad_ref in zip(names, grads_fast, grads_ref, strict=True):
            assert grad_fast.dtype == low[name].dtype
            _assert_relative(grad_fast, grad_ref, 2e-2, f"bf16 {kind} gradient of {name}")


@pytest.mark.parametrize("kind", ["read", "add", "delta"])
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_stream_kernel_matches_reference(kind, n, dtype):
    torch.manual_seed(n)
    _stream_case(kind, n, 24, dtype)


@pytest.mark.parametrize("kind", ["read", "add", "delta"])
def test_stream_kernel_blocks_and_static_maps(kind):
    """Several hidden blocks with a ragged last one (d = 20 in blocks of 8: the delta write's two-pass
    path), odd n, and static maps broadcast over tokens (their gradients summed over tokens)."""
    torch.manual_seed(0)
    _stream_case(kind, 3, 20, torch.float32, static=True, block_d=8)


def test_stream_kernels_with_identity_mixing():
    """H_res = None (identity): the add write is X + s u^T, the delta write x + beta (v - X k) k^T."""
    values = _inputs((2,), 2, 16, static=False)
    x, s, u = (values[name].float() for name in ("streams", "amplitudes", "output"))
    torch.testing.assert_close(triton_mix_and_write(None, x, s, u), x + s[..., None] * u[..., None, :])
    k, beta, v = (values[name].float() for name in ("direction", "beta", "value"))
    expected = x + (beta * (v - (x * k[..., None, :]).sum(-1)))[..., None] * k[..., None, :]
    torch.testing.assert_close(triton_delta_write(None, x, k, beta, v), expected)


def test_delta_write_hand_computed():
    """n = 1, d = 2 (DDL eq. 3.7): x = (3, 4), k = (1, 0), beta = 0.5, v = 1 -> x' = (3 + 0.5 (1 - 3), 4)."""
    x = torch.tensor([[[3.0, 4.0]]], device=DEVICE)
    k, beta, v = (torch.tensor(value, device=DEVICE) for value in ([[1.0, 0.0]], [[0.5]], [[1.0]]))
    out = triton_delta_write(None, x, k, beta, v)
    assert out.tolist() == [[[2.0, 4.0]]]


def test_stream_kernels_empty_inputs():
    """No tokens, or d = 0: empty outputs and zero gradients, as the reference gives."""
    weights = torch.rand(4, device=DEVICE, requires_grad=True)
    out = triton_read_streams(weights, torch.randn(0, 3, 4, 8, device=DEVICE))
    assert out.shape == (0, 3, 8)
    assert torch.equal(torch.autograd.grad(out.sum(), weights)[0], torch.zeros(4, device=DEVICE))
    h_res = torch.rand(2, 4, 4, device=DEVICE, requires_grad=True)
    empty = torch.randn(2, 4, 0, device=DEVICE)
    out = triton_delta_write(
        h_res, empty, empty[:, 0], torch.ones(2, 1, device=DEVICE), torch.randn(2, 4, device=DEVICE)
    )
    assert out.shape == (2, 4, 0)
    assert torch.equal(torch.autograd.grad(out.sum(), h_res)[0], torch.zeros(2, 4, 4, device=DEVICE))


def test_stream_kernels_bad_input():
    x = torch.randn(2, 4, 8, device=DEVICE)
    with pytest.raises(ValueError, match="h_res"):
        triton_mix_and_write(torch.ones(2, 3, 3), x, torch.ones(2, 4), torch.ones(2, 8))
    with pytest.raises(ValueError, match="weights"):
        triton_read_streams(torch.ones(3, 4), x)
    with pytest.raises(TypeError, match="direction"):
        triton_delta_write(None, x, "k", torch.ones(1), torch.ones(2, 4))
    with pytest.raises(TypeError, match="float64"):
        triton_read_streams(torch.ones(4), x.double())
    with pytest.raises(ValueError, match="block_d"):
        triton_read_streams(torch.ones(4), x, block_d=0)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["read", "add", "delta"])
@pytest.mark.parametrize(("n", "d", "block_d"), [(8, 64, None), (16, 96, None), (5, 77, 32), (4, 520, None)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_stream_kernel_matches_reference_large(kind, n, d, block_d, dtype):
    torch.manual_seed(n + d)
    _stream_case(kind, n, d, dtype, static=n == 5, block_d=block_d)


# ----------------------------------------------------------------------------------------------
# GPU build


@pytest.mark.slow
def test_kernels_compile_for_a_gpu(tmp_path):
    """Every kernel, at the launch options the wrappers use (n = 2, 4; the charts' plain and scaled interval
    choices; float32 and bfloat16 streams), compiles for sm_90 through ptxas: the interpreter runs kernels
    without lowering them."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path)}
    worker = Path(__file__).with_name("triton_compile_worker.py")
    result = subprocess.run(
        [sys.executable, str(worker), "2", "4"], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]
    compiled = result.stdout.splitlines()
    assert len(compiled) == 2 * (8 + 2 * 2 * 6), result.stdout


# ----------------------------------------------------------------------------------------------
# Dispatch


def test_the_rule_chooses_from_device_dtype_and_tracing(monkeypatch):
    """The kernel for CUDA tensors in a kernel dtype (CPU tensors only inside `ops_path("triton")`), the node
    for float64 streams, under tracing and inside `ops_path("node")`, the reference inside
    `ops_path("naive")`."""
    cpu, double = torch.zeros(2), torch.zeros(2, dtype=torch.float64)
    expected = "triton" if DEVICE == "cuda" else "node"
    assert choose_path(torch.zeros(2, device=DEVICE), None, kernel_dtypes=STREAM_DTYPES) == expected
    assert choose_path(cpu, kernel_dtypes=STREAM_DTYPES) == "node"
    assert choose_path(double.to(DEVICE), kernel_dtypes=STREAM_DTYPES) == "node"
    assert choose_path(double.to(DEVICE), kernel_dtypes=(torch.float64,)) == expected
    if os.environ.get("TRITON_INTERPRET") == "1":
        with ops_path("triton"):
            assert choose_path(cpu, None, cpu, kernel_dtypes=STREAM_DTYPES) == "triton"
            assert choose_path(double, kernel_dtypes=STREAM_DTYPES) == "node"
            with ops_path("naive"):
                assert choose_path(cpu, kernel_dtypes=STREAM_DTYPES) == "naive"
            monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
            assert choose_path(cpu, kernel_dtypes=STREAM_DTYPES) == "node"
            monkeypatch.undo()
        assert choose_path(cpu, kernel_dtypes=STREAM_DTYPES) == "node"
    with ops_path("node"):
        assert choose_path(torch.zeros(2, device=DEVICE), kernel_dtypes=STREAM_DTYPES) == "node"
    with pytest.raises(ValueError, match="path must be one of"), ops_path("fused"):
        pass
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"), ops_path("triton"):
        pass


@pytest.mark.parametrize("residual", ["delta", "add"])
def test_model_dispatches_to_the_kernels_and_equals_the_reference_model(residual, monkeypatch):
    """On DEVICE (CUDA, or CPU inside `ops_path("triton")`) the model runs the Triton chart, read and write
    kernels (the read after the maps projection); its loss and gradients equal those of the same weights on
    CPU tensors inside `ops_path("naive")`, where no kernel can run (the naive ops and charts)."""
    from geoformers import DDLmHCConfig, DDLmHCForCausalLM

    shape = dict(
        vocab_size=29, hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2
    )
    torch.manual_seed(0)
    fused = DDLmHCForCausalLM(DDLmHCConfig(**shape, hc_streams=4, residual=residual))
    reference = DDLmHCForCausalLM(DDLmHCConfig(**shape, hc_streams=4, residual=residual))
    reference.load_state_dict(fused.state_dict())
    calls = []
    for module, name in (
        (write_kernels, "triton_delta_write" if residual == "delta" else "triton_mix_and_write"),
        (chart_kernels, "triton_chart"),
        (read_kernels, "triton_read_streams"),
    ):
        original = getattr(module, name)
        monkeypatch.setattr(
            module, name, lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k)
        )
    ids = torch.randint(0, 29, (2, 5), generator=torch.Generator().manual_seed(1))
    fused.to(DEVICE)
    with _dispatching():
        loss = fused(input_ids=ids.to(DEVICE), labels=ids.to(DEVICE)).loss
        loss.backward()
    assert len(set(calls)) == 3  # the three kernels ran, once per sublayer
    calls.clear()
    with ops_path("naive"):
        expected = reference(input_ids=ids, labels=ids).loss
        expected.backward()
    assert calls == []  # the reference ran no kernel
    torch.testing.assert_close(loss.cpu(), expected, atol=1e-5, rtol=0)
    for (name, p), q in zip(fused.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad.cpu(), q.grad, atol=1e-5, rtol=1e-4, msg=name)
