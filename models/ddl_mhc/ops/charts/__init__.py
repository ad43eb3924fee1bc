"""Doubly-stochastic charts: unconstrained logits -> a matrix in the Birkhoff polytope (docs/ddl_mhc.md,
'Doubly-stochastic charts'; the layout of this folder: 'One home per op').

B_n = {X >= 0, X 1 = 1, X^T 1 = 1}. `birkhoff(logits, n, method)` maps logits of shape
(..., num_logits(method, n)) to one matrix per leading index, shape (..., n, n):

- "tbp": transport Birkhoff polytope, north-west corner; (n-1)^2 logits; exact, onto the interior.
- "rtbp": recursive TBP (2x2 blocks, batched children); (n-1)^2 logits; exact, onto the interior.
- "sinkhorn": mHC, exp then `iters` row/column normalisations in log space; n^2 logits; approximate.
- "mhc_lite": softmax over the n! permutation matrices; n! logits; exact; n <= MHC_LITE_MAX_N.
- "kromhc": Kronecker product of log2(n) 2x2 factors [[s, 1-s], [1-s, s]]; exact; n = 2^k.
- "stbp", "srtbp", "mstbp", "msrtbp": tbp and rtbp with the TBP-mHC authors' scaled / margined interval
  choice; "atbp": their permutation average of tbp (docs/chart_variants.md).

Each name is a row of the chart table `CHARTS` (`models/ddl_mhc/chart_specs.py`: base chart, interval choice,
orderings); `_CHARTS`, the entries `birkhoff` runs, derives from it. `birkhoff` is the op: it checks the
input, turns autocast off, applies the dtype policy and runs the chart's entry on the path of the one rule
(`ops/dispatch.py`): the Triton kernels (`triton.py`) for the transport charts, the autograd
nodes (`tbp_node.py` for TBP, `rtbp_node.py` for RTBP, each with the interval choice as a parameter), or the
plain PyTorch definitions (`naive.py`), which are also the node path of the charts without a node. The exact
charts do their arithmetic in float64 (TBP/RTBP running masses reach n-1 and would cancel in float32) and
round the finished matrix once, so a float32 result has |row/column sum - 1| <= ~6e-8 at any n; Sinkhorn
runs in float32 like mHC. The result is float32, or float64 for float64 logits.
"""

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from geoformers.models.ddl_mhc.chart_specs import (
    CHART_VARIANTS,
    CHARTS,
    METHODS,
    MHC_LITE_MAX_N,
    TRANSPORT_CHARTS,
    ChartSpec,
)
from geoformers.models.ddl_mhc.ops.charts.host import host_chart, host_row_chart
from geoformers.models.ddl_mhc.ops.charts.inverse import (
    rtbp_logits_from_matrix,
    tbp_logits_from_matrix,
    variant_logits_from_matrix,
)
from geoformers.models.ddl_mhc.ops.charts.naive import (
    ATBP_ORDERINGS,
    INTERVAL_CHOICES,
    MARGIN_RHO,
    SCALED_BETA,
    SCALED_EPS,
    SINKHORN_DEFAULT_ITERS,
    ScaledChoice,
    average,
    ds_violation,
    kromhc,
    mhc_lite,
    rtbp,
    sinkhorn,
    tbp,
)
from geoformers.models.ddl_mhc.ops.charts.rtbp_node import schedule_node
from geoformers.models.ddl_mhc.ops.charts.tbp_node import tbp_node
from geoformers.models.ddl_mhc.ops.dispatch import choose_path, kernel
from geoformers.models.ddl_mhc.ops.precision import autocast_off, cast
from geoformers.models.value_checks import checks_values

__all__ = [
    "ATBP_ORDERINGS",
    "CHARTS",
    "CHART_VARIANTS",
    "MARGIN_RHO",
    "METHODS",
    "MHC_LITE_MAX_N",
    "SCALED_BETA",
    "SCALED_EPS",
    "SINKHORN_DEFAULT_ITERS",
    "ChartSpec",
    "ScaledChoice",
    "birkhoff",
    "chart_rows",
    "ds_violation",
    "num_logits",
    "rtbp_logits_from_matrix",
    "tbp_logits_from_matrix",
    "variant_logits_from_matrix",
]

TRITON_KERNELS = "geoformers.models.ddl_mhc.ops.charts.triton"
KERNEL_DTYPES = (torch.float32, torch.float64)  # the chart kernels take float32 or float64 logits
# The host path takes up to HOST_POINTS // (n-1)^2 rows (decoding: a token per sequence): 5 at n = 4, 1 at
# n = 8, none from n = 9 on. `python scripts/bench_birkhoff.py --host` (benchmarks/chart_host.json): the
# host path's time grows with rows x (n-1)^4, the node's barely, and they cross near 5 rows at n = 4 and
# 1-2 rows at n = 8 (docs/ddl_mhc.md, 'Choosing a path').
HOST_POINTS = 50


class _Chart(NamedTuple):
    """A chart of the table: logits per matrix for n; the chart on logits (B, k) in the result's dtype
    (float32 or float64) -> (B, n, n), n >= 2 for the transport charts; whether Triton kernels exist; its
    `naive.py` definition where `chart` runs a node (None: `chart` is the naive definition); its host
    evaluation for a few CPU rows (`host.py`; None: none)."""

    num_logits: Callable[[int], int]
    chart: Callable[[torch.Tensor, int], torch.Tensor]
    triton: bool = False
    naive: Callable[[torch.Tensor, int], torch.Tensor] | None = None
    host: Callable[[torch.Tensor, int], torch.Tensor] | None = None


def _transport_count(n: int) -> int:
    return (n - 1) ** 2


_BASES = {  # the charts that are no transport chart, float64 but for Sinkhorn (mHC runs it in float32)
    "sinkhorn": _Chart(lambda n: n * n, sinkhorn),
    "mhc_lite": _Chart(math.factorial, lambda flat, n: mhc_lite(flat.double(), n)),
    "kromhc": _Chart(lambda n: n.bit_length() - 1, lambda flat, n: kromhc(flat.double(), n)),
}


def _transport(base: str, choice) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """The node of a transport chart with an interval choice (logits (B, (n-1)^2) -> (B, n, n) in their
    dtype): TBP's wavefront (`tbp_node.py`), RTBP's schedule (`rtbp_node.py`)."""
    if base == "tbp":
        return lambda flat, n: tbp_node(flat, n, flat.dtype, choice)
    return lambda flat, n: schedule_node(flat, n, base, flat.dtype, choice)


def _naive(base: str, choice) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """The `naive.py` definition of a transport chart with an interval choice, in float64."""
    chart = tbp if base == "tbp" else rtbp
    return lambda flat, n: chart(flat.double(), n, choice)


def _variant(spec: ChartSpec) -> _Chart:
    """The table's entry of `spec`: a transport chart is its base's node with the spec's interval choice,
    averaged over the spec's orderings when it has several (ATBP, in float64); both have Triton kernels
    (`triton.triton_chart`) and a naive definition."""
    if spec.base in _BASES:
        return _BASES[spec.base]
    choice = INTERVAL_CHOICES[spec.interval]
    chart, naive = _transport(spec.base, choice), _naive(spec.base, choice)
    if len(spec.orderings) == 1:
        host = lambda flat, n: host_chart(flat, n, spec.base, choice)  # noqa: E731
        return _Chart(_transport_count, chart, triton=True, naive=naive, host=host)
    k = len(spec.orderings)
    return _Chart(
        lambda n: k * (_transport_count(n) + 1),
        lambda flat, n: average(flat.double(), n, chart, spec.orderings),
        triton=True,
        naive=lambda flat, n: average(flat.double(), n, naive, spec.orderings),
    )


_CHARTS: dict[str, _Chart] = {name: _variant(spec) for name, spec in CHARTS.items()}


def _check_method_and_n(method: str, n: int) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if method == "kromhc" and n & (n - 1):
        raise ValueError(f"kromhc needs n to be a power of two (n = 2^k), got n={n}")
    if method == "mhc_lite" and n > MHC_LITE_MAX_N:
        raise ValueError(
            f"mhc_lite needs n <= {MHC_LITE_MAX_N} ({math.factorial(MHC_LITE_MAX_N)} logits, one per "
            f"permutation), got n={n} ({math.factorial(n)} permutations)"
        )


def num_logits(method: str, n: int) -> int:
    """Number of logits per matrix: (n-1)^2 for tbp/rtbp and their interval variants, n^2 for sinkhorn, n!
    for mhc_lite, log2(n) for kromhc, K ((n-1)^2 + 1) for K orderings averaged (atbp: K = 2)."""
    _check_method_and_n(method, n)
    return _CHARTS[method].num_logits(n)


def _check_logits(logits: torch.Tensor, n: int, method: str) -> None:
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must have a floating dtype, got {logits.dtype}")
    expected = num_logits(method, n)
    if logits.ndim == 0 or logits.shape[-1] != expected:
        raise ValueError(
            f"{method} with n={n} expects logits of shape (..., {expected}), got {tuple(logits.shape)}"
        )


def _check_values(logits: torch.Tensor) -> None:
    """ValueError for a NaN or infinite logit (the host path checks its rows itself)."""
    if not checks_values(logits):  # a host sync per chart on accelerators; a graph break when compiling
        return
    # One float64 reduction (no float32 overflow) is non-finite iff some logit is; confirm exactly.
    total = float(logits.detach().sum(dtype=torch.float64))
    if not math.isfinite(total) and not bool(torch.isfinite(logits).all()):
        raise ValueError("logits contain NaN or infinite values")


def birkhoff(logits: torch.Tensor, n: int, method: str = "rtbp", **options) -> torch.Tensor:
    """Doubly-stochastic chart (docs/ddl_mhc.md, 'Doubly-stochastic charts'):
    logits (..., num_logits(method, n)) -> (..., n, n).

    Options: `iters` (sinkhorn only, default SINKHORN_DEFAULT_ITERS). Autocast is disabled
    inside; float64 logits give a float64 result, any other float dtype a float32 one.
    """
    _check_method_and_n(method, n)
    allowed = {"iters"} if method == "sinkhorn" else set()
    unexpected = sorted(set(options) - allowed)
    if unexpected:
        raise TypeError(
            f"birkhoff(method={method!r}) got unexpected options {unexpected}; valid: {sorted(allowed)}"
        )
    iters = options.get("iters", SINKHORN_DEFAULT_ITERS)
    if method == "sinkhorn" and (isinstance(iters, bool) or not isinstance(iters, int) or iters < 1):
        raise ValueError(f"sinkhorn option iters must be an int >= 1, got {iters!r}")
    _check_logits(logits, n, method)

    entry = _CHARTS[method]
    batch_shape = logits.shape[:-1]
    out_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    if n == 1 and entry.num_logits(1) == 0:
        # No logits: the 1 x 1 matrix [1], still attached to the graph of `logits` (zero gradient).
        x = (logits.to(out_dtype).sum(-1) + 1)[..., None, None]
    else:
        with autocast_off(logits.device.type):
            flat = cast(logits.reshape(-1, logits.shape[-1]), out_dtype)
            host_rows = HOST_POINTS // _transport_count(n) if entry.host is not None else 0
            path = choose_path(flat, kernel_dtypes=KERNEL_DTYPES, host_rows=host_rows)
            if path != "host":
                _check_values(logits)
            chart_kernel = None
            if path == "triton" and entry.triton and flat.shape[0] > 0:
                chart_kernel = kernel(TRITON_KERNELS, "triton_chart")
            if chart_kernel is not None:
                x = chart_kernel(flat, n, method)
            elif method == "sinkhorn":
                x = sinkhorn(flat, n, iters)
            elif path == "host" and flat.shape[0] > 0:
                x = entry.host(flat, n)
            elif path == "naive" and entry.naive is not None:
                x = entry.naive(flat, n)
            else:
                x = entry.chart(flat, n)
        if x.dtype != out_dtype or not x.is_contiguous():
            x = x.to(out_dtype, memory_format=torch.contiguous_format)
        x = x.view(*batch_shape, n, n)
    return x


@functools.cache
def row_chart(method: str, n: int) -> Callable[[list[float]], list[float]] | None:
    """The host evaluation of chart `method` on one row of logits (Python floats -> the row-major n x n
    entries) for the transport charts of one ordering (`host.host_row_chart`), None for the others."""
    spec = CHARTS[method]
    if spec.base in TRANSPORT_CHARTS and len(spec.orderings) == 1:
        return host_row_chart(spec.base, n, INTERVAL_CHOICES[spec.interval])
    return None


def chart_rows(rows: list[list[float]], n: int, method: str, dtype: torch.dtype) -> list[list[float]]:
    """The chart `method` of logit rows given as Python floats -> the row-major n x n entries of each, as
    Python floats, for the host path of the hyper-connection (`ops/host_connection.py`): the transport charts
    of one ordering are evaluated on the host (`row_chart`, float64), the others by `birkhoff` on logits of
    `dtype` (the node path's logits dtype). n >= 2; ValueError for a NaN or infinite logit."""
    chart = row_chart(method, n)
    if chart is not None:
        return list(map(chart, rows))
    return birkhoff(torch.tensor(rows, dtype=dtype), n, method).view(-1, n * n).tolist()
