"""The TBP-mHC authors' chart variants (DDL-mHC `ops/charts`, docs/chart_variants.md) and the lazy-minorized
H_res mix (`ddl_mhc.lazy_mix`). Independent references: the plain-Python charts of
`chart_references` with the variant's interval choice swapped in, a plain-Python power-of-two RTBP
written from the authors' RTBP2N formulas, explicit permutation matrices, hand computations."""

import math

import chart_references
import pytest
import torch
from chart_references import rtbp_reference, tbp_reference
from test_birkhoff import random_interior_ds

from geoformers import DDLmHCConfig, DDLmHCForCausalLM
from geoformers.model_io.remote_code import remote_code_files
from geoformers.models.ddl_mhc.chart_specs import TRANSPORT_CHARTS, ChartSpec
from geoformers.models.ddl_mhc.modeling_ddl_mhc import LAZY_UNIFORM_INIT, lazy_mix, lazy_mix_logits
from geoformers.models.ddl_mhc.ops.charts import (
    ATBP_ORDERINGS,
    CHART_VARIANTS,
    CHARTS,
    MARGIN_RHO,
    METHODS,
    SCALED_BETA,
    SCALED_EPS,
    ScaledChoice,
    birkhoff,
    ds_violation,
    num_logits,
    variant_logits_from_matrix,
)
from geoformers.models.ddl_mhc.ops.charts.naive import INTERVAL_CHOICES, rtbp, tbp
from geoformers.models.ddl_mhc.ops.charts.rtbp_node import schedule_node
from geoformers.models.ddl_mhc.ops.charts.tbp_node import tbp_node
from geoformers.models.ddl_mhc.ops.dispatch import ops_path


def test_hub_code_ships_the_chart_table_with_the_variants():
    files = remote_code_files(
        "geoformers.models.ddl_mhc.modeling_ddl_mhc", "geoformers.models.ddl_mhc.configuration_ddl_mhc"
    )
    table = files["chart_specs.py"]
    assert all(f'"{method}": ChartSpec(' in table for method in VARIANTS)
    charts = files["ops_charts.py"]
    assert "_CHARTS: dict[str, _Chart] = {name: _variant(spec) for name, spec in CHARTS.items()}" in charts
    assert "from .ops_charts import birkhoff, num_logits" in files["modeling_ddl_mhc.py"]


def test_every_list_of_charts_derives_from_the_one_table():
    """The names, the variants, the interval variants and the Triton kernels' charts all come from CHARTS,
    whose specs are well formed: a base that is itself a plain row, a known interval choice, orderings (and a
    choice) only on transport charts."""
    assert METHODS == tuple(CHARTS) and set(VARIANTS) == set(CHART_VARIANTS)
    for name, spec in CHARTS.items():
        assert CHARTS[spec.base] == ChartSpec(spec.base), name
        assert spec.interval in INTERVAL_CHOICES and len(spec.orderings) >= 1, name
        if spec.base not in TRANSPORT_CHARTS:
            assert (spec.interval, spec.orderings) == ("plain", ("direct",)), name
    assert {name: (CHARTS[name].base, CHARTS[name].interval) for name in INTERVAL} == {
        name: (base, "margined" if rho else "scaled") for name, (base, rho) in INTERVAL.items()
    }
    assert CHARTS["atbp"].orderings == ATBP_ORDERINGS


pytestmark = pytest.mark.usefixtures("single_thread")

VARIANTS = ("stbp", "srtbp", "mstbp", "msrtbp", "atbp")
INTERVAL = {  # method -> (chart it varies, margin)
    "stbp": ("tbp", 0.0),
    "srtbp": ("rtbp", 0.0),
    "mstbp": ("tbp", MARGIN_RHO),
    "msrtbp": ("rtbp", MARGIN_RHO),
}
SIZES = (*range(1, 10), 16)
SMALL = dict(vocab_size=37, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2)


def plain_point(low, high, logits):
    """tbp/rtbp's own choice L + (U - L) sigmoid(t), written here from its formula."""
    return low + (high - low) * torch.sigmoid(logits)


class PlainPoint:
    point = staticmethod(plain_point)


def scalar_point(rho: float):
    """The scaled/margined choice on Python floats, written from its formula."""

    def point(low: float, high: float, t: float) -> float:
        width = max(high - low, 0.0)
        fraction = chart_references._sigmoid(SCALED_BETA * t / (width + SCALED_EPS))
        return low + width * (rho + (1.0 - 2.0 * rho) * fraction)

    return point


def normal_logits(method: str, n: int, count: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(count, num_logits(method, n), generator=generator, dtype=torch.float64) * scale


# ---------------------------------------------------------------------------------------------
# The pluggable forms and the references


@pytest.mark.parametrize("n", SIZES[1:])
def test_plain_choice_gives_back_tbp_and_rtbp(n):
    """With tbp/rtbp's own choice (written here) the naive charts equal the autograd nodes (same layout)."""
    logits = normal_logits("tbp", n, 6, seed=n)
    for naive, expected in (
        (tbp, tbp_node(logits, n, torch.float64)),
        (rtbp, schedule_node(logits, n, "rtbp", torch.float64)),
    ):
        torch.testing.assert_close(naive(logits, n, PlainPoint()), expected, atol=1e-13, rtol=0)


@pytest.mark.parametrize("method", ("stbp", "srtbp", "mstbp", "msrtbp"))
@pytest.mark.parametrize("n", (2, 3, 4, 5, 6, 7, 8))
def test_interval_variants_equal_the_plain_python_reference(method, n, monkeypatch):
    base, rho = INTERVAL[method]
    monkeypatch.setattr(chart_references, "_point_in_interval", scalar_point(rho))
    reference = tbp_reference if base == "tbp" else rtbp_reference
    logits = normal_logits(method, n, 4, seed=10 + n)
    expected = torch.tensor([reference(row.tolist(), n) for row in logits], dtype=torch.float64)
    torch.testing.assert_close(birkhoff(logits, n, method), expected, atol=1e-13, rtol=0)


def nodes_of(method: str) -> list:
    """The autograd nodes that run `method`'s base chart with its interval choice, called directly: TBP's
    wavefront node and the schedule node (the chart table's RTBP, and the schedule the Triton kernels run)."""
    base, choice = CHARTS[method].base, INTERVAL_CHOICES[CHARTS[method].interval]
    nodes = [lambda t, n: schedule_node(t, n, base, t.dtype, choice)]
    if base == "tbp":
        nodes.append(lambda t, n: tbp_node(t, n, t.dtype, choice))
    return nodes


@pytest.mark.parametrize("method", tuple(INTERVAL))
@pytest.mark.parametrize("n", SIZES)
def test_nodes_equal_the_autograd_reference(method, n):
    """The hand-written backwards of every interval variant against autograd through the naive `tbp` /
    `rtbp` with the same choice, at moderate and saturating logits."""
    base, choice = CHARTS[method].base, INTERVAL_CHOICES[CHARTS[method].interval]
    generator = torch.Generator().manual_seed(n)
    upstream = torch.randn(16, n, n, generator=generator, dtype=torch.float64)
    for scale in (1.0, 3.0, 50.0):
        logits = torch.randn(16, (n - 1) ** 2, generator=generator, dtype=torch.float64) * scale
        logits.requires_grad_()
        reference = (tbp if base == "tbp" else rtbp)(logits, n, choice)
        (grad_reference,) = torch.autograd.grad((reference * upstream).sum(), logits)
        for node in nodes_of(method):
            fast = node(logits, n)
            torch.testing.assert_close(fast, reference, atol=1e-13, rtol=0)
            (grad_fast,) = torch.autograd.grad((fast * upstream).sum(), logits)
            torch.testing.assert_close(grad_fast, grad_reference, atol=1e-11, rtol=0)
            with torch.no_grad():  # the forward alone (decoding) gives the same chart
                assert torch.equal(node(logits, n), fast.detach())


@pytest.mark.parametrize("method", tuple(INTERVAL))
def test_float32_logits_keep_the_float64_chart_and_gradient(method):
    """float32 logits: the chart is the float64 chart rounded once, the gradient float32 and close to the
    float64 one."""
    n = 6
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(40, (n - 1) ** 2, generator=generator, dtype=torch.float64) * 0.5
    upstream = torch.randn(40, n, n, generator=generator, dtype=torch.float64)
    for node in nodes_of(method):
        single, double = logits.float().requires_grad_(), logits.float().double().requires_grad_()
        x32, x64 = node(single, n), node(double, n)
        assert x32.dtype == torch.float32 and torch.equal(x32, x64.float())
        (x32 * upstream.float()).sum().backward()
        (x64 * upstream).sum().backward()
        assert single.grad.dtype == torch.float32
        torch.testing.assert_close(single.grad.double(), double.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("method", VARIANTS)
def test_compiles_as_one_graph_with_eager_values_and_gradients(method):
    """torch.compile(fullgraph=True) traces each variant's chart, its autograd node included (aot_eager)."""
    n = 4
    logits = normal_logits(method, n, 6, seed=5, scale=1.0).float()
    upstream = torch.randn(6, n, n, generator=torch.Generator().manual_seed(6))

    def eager(t: torch.Tensor) -> torch.Tensor:
        return birkhoff(t, n, method)

    results = []
    for compiled in (False, True):
        torch._dynamo.reset()
        chart = torch.compile(eager, fullgraph=True, backend="aot_eager") if compiled else eager
        t = logits.clone().requires_grad_()
        x = chart(t)
        (x * upstream).sum().backward()
        results.append((x.detach(), t.grad))
    torch.testing.assert_close(results[1][0], results[0][0], atol=0, rtol=0)
    torch.testing.assert_close(results[1][1], results[0][1], atol=1e-7, rtol=0)


def test_hand_computed_n2():
    """n = 2: X = [[x, 1 - x], [1 - x, x]] with x chosen in [0, 1]."""
    t = torch.tensor([[0.3], [-1.2]], dtype=torch.float64)
    scaled = torch.sigmoid(4.0 * t / 1.001)
    margined = 1e-4 + (1 - 2e-4) * scaled
    for method, x in (("stbp", scaled), ("srtbp", scaled), ("mstbp", margined), ("msrtbp", margined)):
        expected = torch.cat([x, 1 - x, 1 - x, x], 1).view(2, 2, 2)
        torch.testing.assert_close(birkhoff(t, 2, method), expected, atol=1e-15, rtol=0)


@pytest.mark.parametrize("n", (3, 4, 7))
def test_zero_logits_start_where_the_base_chart_starts(n):
    """At t = 0 every fraction is 1/2, margin or not: the variants start at TBP(0) and RTBP(0) (J/n for
    n = 2^k)."""
    zeros = torch.zeros(1, (n - 1) ** 2, dtype=torch.float64)
    for method, (base, _) in INTERVAL.items():
        torch.testing.assert_close(birkhoff(zeros, n, method), birkhoff(zeros, n, base), atol=1e-15, rtol=0)
    if n & (n - 1) == 0:
        torch.testing.assert_close(birkhoff(zeros, n, "srtbp")[0], torch.full((n, n), 1 / n).double())


# ---------------------------------------------------------------------------------------------
# Exactness, gradients, bad input


@pytest.mark.parametrize("method", VARIANTS)
@pytest.mark.parametrize("n", SIZES)
def test_float32_exact_and_nonnegative(method, n):
    generator = torch.Generator().manual_seed(n)
    normal = torch.randn(128, num_logits(method, n), generator=generator) * 3
    extreme = torch.where(torch.rand(normal.shape, generator=generator) < 0.5, -50.0, 50.0)
    for logits in (normal, extreme):
        x = birkhoff(logits, n, method)
        assert x.dtype == torch.float32 and x.shape == (128, n, n)
        assert float(ds_violation(x).max()) <= 1e-7
        assert float(x.min()) >= 0.0


@pytest.mark.parametrize("method", VARIANTS)
@pytest.mark.parametrize("n", (2, 3, 4, 5))
def test_gradcheck_float64(method, n):
    logits = normal_logits(method, n, 3, seed=n, scale=1.0).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: birkhoff(t, n, method), (logits,))


def test_num_logits_and_bad_input():
    assert [num_logits(m, 4) for m in VARIANTS] == [9, 9, 9, 9, 2 * (9 + 1)]
    assert num_logits("atbp", 1) == len(ATBP_ORDERINGS)
    with pytest.raises(ValueError, match=r"atbp with n=4 expects logits of shape \(\.\.\., 20\)"):
        birkhoff(torch.zeros(3, 9), 4, "atbp")
    with pytest.raises(TypeError, match="unexpected options"):
        birkhoff(torch.zeros(3, 9), 4, "stbp", iters=3)
    with pytest.raises(ValueError, match="NaN"):
        birkhoff(torch.full((3, 9), math.nan), 4, "msrtbp")
    for field, value in (("beta", 0.0), ("beta", math.inf), ("eps", -1.0), ("rho", 0.5), ("rho", True)):
        with pytest.raises(ValueError, match=f"`{field}`"):
            ScaledChoice(**{field: value})


# ---------------------------------------------------------------------------------------------
# What the variants fix


def test_scaled_choice_keeps_the_gradient_on_narrow_intervals():
    """d x / d t at t = 0 on an interval of width W: W / 4 for tbp's choice, which vanishes with W;
    beta W / (4 (W + eps)) for the scaled one, about beta / 4 while W >> eps."""
    low = torch.tensor([0.2, 0.2], dtype=torch.float64)
    high = low + torch.tensor([1e-1, 1e-2], dtype=torch.float64)
    t = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    (plain,) = torch.autograd.grad(plain_point(low, high, t).sum(), t)
    (scaled,) = torch.autograd.grad(ScaledChoice().point(low, high, t).sum(), t)
    width = high - low
    torch.testing.assert_close(plain, width / 4)
    torch.testing.assert_close(scaled, SCALED_BETA * width / (4 * (width + SCALED_EPS)))
    assert float(scaled.min()) > 0.9 and float(plain.max()) < 0.03


def test_margin_keeps_every_entry_positive_at_saturated_logits():
    """At logits +-50 tbp's choice lands on interval ends (zero entries); the margined choice stays inside."""
    signs = torch.randn(64, 9, generator=torch.Generator().manual_seed(3), dtype=torch.float64).sign()
    assert float(birkhoff(signs * 50, 4, "tbp").min()) == 0.0
    for method in ("mstbp", "msrtbp"):
        assert float(birkhoff(signs * 50, 4, method).min()) > 1e-16


def test_atbp_equals_the_explicit_permutation_average():
    n, k = 4, len(ATBP_ORDERINGS)
    logits = normal_logits("atbp", n, 5, seed=4)
    orderings = {"direct": list(range(n)), "reverse": list(range(n - 1, -1, -1))}
    expected = []
    for row in logits:
        weights = torch.softmax(row[:k], 0)
        total = torch.zeros(n, n, dtype=torch.float64)
        for index, name in enumerate(ATBP_ORDERINGS):
            perm = torch.zeros(n, n, dtype=torch.float64)
            perm[range(n), orderings[name]] = 1.0  # P[i, pi(i)] = 1
            chart = tbp_reference(row[k + index * 9 : k + (index + 1) * 9].tolist(), n)
            chart = torch.tensor(chart, dtype=torch.float64)
            total += weights[index] * perm.T @ chart @ perm
        expected.append(total)
    torch.testing.assert_close(birkhoff(logits, n, "atbp"), torch.stack(expected), atol=1e-13, rtol=0)


def test_atbp_removes_the_north_west_corner_bias():
    """TBP(0) favours the north-west corner (its first entry takes half the mass, the south-east one less);
    ATBP with equal weights and equal charts is symmetric under the 180-degree rotation (reversal)."""
    n = 5
    tbp = birkhoff(torch.zeros(1, 16, dtype=torch.float64), n, "tbp")[0]
    assert float(tbp[0, 0]) == 0.5 and float(tbp[-1, -1]) < 0.4
    t = normal_logits("tbp", n, 3, seed=8)
    logits = torch.cat([torch.zeros(3, 2, dtype=torch.float64), t, t], 1)
    x = birkhoff(logits, n, "atbp")
    torch.testing.assert_close(x, x.flip(-1, -2), atol=1e-15, rtol=0)
    one_sided = torch.cat([torch.tensor([[60.0, -60.0]] * 3, dtype=torch.float64), t, t], 1)  # w -> (1, 0)
    torch.testing.assert_close(birkhoff(one_sided, n, "atbp"), birkhoff(t, n, "tbp"), atol=1e-12, rtol=0)


# ---------------------------------------------------------------------------------------------
# RTBP and the authors' power-of-two RTBP2N


def rtbp2n_reference(logits: list[float], n: int, point) -> list[list[float]]:
    """The authors' RTBP2N for n = 2^k, written from its formulas: block mass m11 in
    [max(0, R1 - C2, C1 - R2), min(R1, C1)], balanced binary splits a (top rows, m11), gamma (bottom rows,
    m21), u (left columns, m11), s (right columns, m12), then blocks A(a, u), B(r_top - a, s),
    C(gamma, c_left - u), D(r_bottom - gamma, c_right - s)."""

    def binary_split(caps, total, ts):
        if len(caps) == 1:
            return [total]
        h = len(caps) // 2
        left = point(max(0.0, total - sum(caps[h:])), min(total, sum(caps[:h])), ts[0])
        return binary_split(caps[:h], left, ts[1:h]) + binary_split(caps[h:], total - left, ts[h:])

    def transport(rows, cols, ts):
        if len(rows) == 1:
            return [[rows[0]]]
        h = len(rows) // 2
        r1, r2, c1, c2 = sum(rows[:h]), sum(rows[h:]), sum(cols[:h]), sum(cols[h:])
        m11 = point(max(0.0, r1 - c2, c1 - r2), min(r1, c1), ts[0])
        pieces, k = [], 1
        for caps, total in ((rows[:h], m11), (rows[h:], c1 - m11), (cols[:h], m11), (cols[h:], r1 - m11)):
            pieces.append(binary_split(caps, total, ts[k : k + h - 1]))
            k += h - 1
        a, gamma, u, s = pieces
        minus = lambda xs, ys: [x - y for x, y in zip(xs, ys, strict=True)]
        q = (h - 1) ** 2
        marginals = (
            (a, u),
            (minus(rows[:h], a), s),
            (gamma, minus(cols[:h], u)),
            (minus(rows[h:], gamma), minus(cols[h:], s)),
        )
        tl, tr, bl, br = (transport(r, c, ts[k + i * q :][:q]) for i, (r, c) in enumerate(marginals))
        return [x + y for x, y in zip(tl, tr, strict=True)] + [x + y for x, y in zip(bl, br, strict=True)]

    return transport([1.0] * n, [1.0] * n, logits)


@pytest.mark.parametrize("n", (2, 4, 8, 16))
def test_rtbp_is_the_authors_rtbp2n_for_powers_of_two(n):
    """RTBP's recursion only halves for n = 2^k and its splits are balanced binary trees, so it is the same
    map as the authors' RTBP2N (and srtbp / msrtbp are their SRTBP2N / MSRTDP2N), logit layout included."""
    for method, point in (
        ("rtbp", lambda low, high, t: low + (high - low) / (1.0 + math.exp(-t))),
        ("srtbp", scalar_point(0.0)),
        ("msrtbp", scalar_point(MARGIN_RHO)),
    ):
        logits = normal_logits("rtbp", n, 3, seed=n)
        expected = [rtbp2n_reference(row.tolist(), n, point) for row in logits]
        expected = torch.tensor(expected, dtype=torch.float64)
        torch.testing.assert_close(birkhoff(logits, n, method), expected, atol=1e-13, rtol=0)


# ---------------------------------------------------------------------------------------------
# Inverses


@pytest.mark.parametrize("method", ("stbp", "srtbp"))
@pytest.mark.parametrize("n", (2, 3, 4, 5, 8))
def test_scaled_inverse_reaches_every_interior_matrix(method, n):
    matrices = random_interior_ds(n, 16, torch.Generator().manual_seed(n))
    logits = variant_logits_from_matrix(matrices, method)
    assert logits.shape == (16, (n - 1) ** 2) and logits.dtype == torch.float64
    torch.testing.assert_close(birkhoff(logits, n, method), matrices, atol=1e-10, rtol=0)


ROUND_TRIPS = [(m, n) for m in ("stbp", "srtbp", "mstbp", "msrtbp") for n in (2, 3, 4)]


@pytest.mark.parametrize(("method", "n"), [*ROUND_TRIPS, ("srtbp", 8), ("msrtbp", 8)])
def test_inverse_round_trip_from_logits(method, n):
    """Small logits: the scaled choice multiplies a logit by beta / (U - L + eps), up to 4000 on narrow
    intervals, so larger ones put late entries at their interval's ends, where no inverse can recover them."""
    logits = normal_logits(method, n, 16, seed=n, scale=0.05)
    matrices = birkhoff(logits, n, method)
    recovered = variant_logits_from_matrix(matrices, method)
    torch.testing.assert_close(recovered, logits, atol=1e-7, rtol=1e-7)
    torch.testing.assert_close(birkhoff(recovered, n, method), matrices, atol=1e-12, rtol=0)


def test_inverse_bad_input():
    matrices = random_interior_ds(4, 2, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="`method`.*atbp.*no inverse"):
        variant_logits_from_matrix(matrices, "atbp")
    with pytest.raises(ValueError, match=r"variant_logits_from_matrix\(method='stbp'\).*interior"):
        variant_logits_from_matrix(torch.eye(4), "stbp")
    d = 1e-6  # x_00 at a fraction 1e-6 < rho of its interval [0, 1]
    row = [(1 - d) / 2, 0.25, 0.25 + d / 2]
    near_corner = torch.tensor([[d, 0.5, 0.5 - d], row, row], dtype=torch.float64)
    assert float(ds_violation(near_corner)) < 1e-15
    variant_logits_from_matrix(near_corner, "stbp")  # in the scaled chart's image
    with pytest.raises(ValueError, match="outside the margined chart's image"):
        variant_logits_from_matrix(near_corner, "mstbp")


# ---------------------------------------------------------------------------------------------
# Lazy-minorized mixing


def test_lazy_mix_hand_computed_and_exact():
    chart = birkhoff(torch.randn(8, 9, generator=torch.Generator().manual_seed(0)), 4, "rtbp")
    weights = torch.tensor([0.2, 0.5, 0.3])
    h = lazy_mix(chart, weights.log())
    expected = 0.2 * torch.eye(4, dtype=torch.float64) + 0.5 * chart.double() + 0.3 / 4
    assert h.dtype == torch.float32
    torch.testing.assert_close(h.double(), expected, atol=1e-7, rtol=0)
    generator = torch.Generator().manual_seed(1)
    for logits in (torch.randn(3, generator=generator) * 5, torch.tensor([80.0, -80.0, 79.0])):
        h = lazy_mix(chart, logits)
        assert float(ds_violation(h).max()) <= 1.5e-7 and float(h.min()) >= 0.0


def test_lazy_mix_initialisation_and_gradients():
    a = 0.05
    weights = torch.softmax(lazy_mix_logits(a).double(), 0)
    mu = LAZY_UNIFORM_INIT
    expected = torch.tensor([(1 - a) * (1 - mu), a * (1 - mu), mu], dtype=torch.float64)
    torch.testing.assert_close(weights, expected)
    chart = birkhoff(torch.randn(2, 9, dtype=torch.float64), 4, "rtbp").requires_grad_()
    logits = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lazy_mix, (chart, logits))


def test_default_mix_is_unchanged_and_lazy_starts_next_to_it():
    ids = torch.randint(0, SMALL["vocab_size"], (2, 6), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    default = DDLmHCForCausalLM(DDLmHCConfig(**SMALL, hc_streams=4, hc_dynamic=False)).eval()
    torch.manual_seed(0)
    lazy = DDLmHCForCausalLM(DDLmHCConfig(**SMALL, hc_streams=4, hc_dynamic=False, hc_res_mix="lazy")).eval()
    connection = default.model.layers[0].attn_connection
    assert connection.res_mix_logits is None and lazy.model.layers[0].attn_connection.res_mix_logit is None
    with torch.no_grad():
        h_default = default(ids, output_mixing=True).mixing[0].h_res
        h_lazy = lazy(ids, output_mixing=True).mixing[0].h_res
        chart = birkhoff(connection.res_bias, 4, "rtbp")
        mix = torch.sigmoid(connection.res_mix_logit)
    assert torch.equal(h_default, (1.0 - mix) * torch.eye(4) + mix * chart)  # the formula, bit for bit
    mu = LAZY_UNIFORM_INIT
    torch.testing.assert_close(h_lazy, (1 - mu) * h_default + mu / 4, atol=1e-7, rtol=0)


def test_lazy_mix_config_validation():
    with pytest.raises(TypeError, match="hc_res_mix"):
        DDLmHCConfig(**SMALL, hc_res_mix="minorized")
    config = DDLmHCConfig(**SMALL)
    with pytest.raises(TypeError, match="hc_res_mix"):
        config.hc_res_mix = 1
    assert config.hc_res_mix == "identity"
    for chart in VARIANTS:
        assert DDLmHCConfig(**SMALL, hc_streams=3, hc_chart=chart).hc_chart == chart


def _model(**overrides):
    torch.manual_seed(0)
    model = DDLmHCForCausalLM(DDLmHCConfig(**SMALL, **overrides))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # off the near-identity start, the uniform weight included
        for name, param in model.named_parameters():
            if "connection" in name:
                param.add_(0.5 * torch.randn(param.shape, generator=generator))
    return model.double()


@pytest.mark.parametrize("residual", ["delta", "add"])
@pytest.mark.parametrize("chart", ["rtbp", "atbp"])
def test_lazy_mix_fused_equals_reference(residual, chart):
    """The path the rule picks against `ops_path("naive")`, same model, float64."""
    ids = torch.randint(0, SMALL["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(2))
    model = _model(hc_streams=4, hc_chart=chart, residual=residual, hc_res_mix="lazy")
    results = []
    for path in ("node", "naive"):
        model.zero_grad(set_to_none=True)
        with ops_path(path):
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
        grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
        results.append((out.logits.detach(), grads))
    (logits_f, grads_f), (logits_r, grads_r) = results
    torch.testing.assert_close(logits_f, logits_r, atol=1e-12, rtol=0)
    assert grads_f.keys() == grads_r.keys() and any(n.endswith("res_mix_logits") for n in grads_r)
    for name in grads_r:
        torch.testing.assert_close(grads_f[name], grads_r[name], atol=1e-12, rtol=1e-10, msg=name)


# ---------------------------------------------------------------------------------------------
# Models with the variants


@pytest.mark.parametrize("chart", VARIANTS)
def test_model_trains_and_round_trips_with_each_variant(chart, tmp_path):
    torch.manual_seed(0)
    mix = "lazy" if chart == "atbp" else "identity"
    config = DDLmHCConfig(**SMALL, hc_streams=4, hc_chart=chart, hc_res_mix=mix)
    model = DDLmHCForCausalLM(config)
    ids = torch.randint(0, SMALL["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(3):
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        optimizer.step()
        losses.append(float(loss.detach()))
    assert all(math.isfinite(value) for value in losses) and losses[-1] < losses[0]
    model.eval().save_pretrained(tmp_path)
    loaded = DDLmHCForCausalLM.from_pretrained(tmp_path).eval()
    assert (loaded.config.hc_chart, loaded.config.hc_res_mix) == (chart, config.hc_res_mix)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=0, rtol=0)
