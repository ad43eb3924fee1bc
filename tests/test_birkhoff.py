"""Doubly-stochastic charts (docs/ddl_mhc.md, 'Doubly-stochastic charts'): exactness, fp64 references,
gradients, inverses, bad input. Independent references: the plain-Python charts in `chart_references`,
explicit Kronecker/permutation sums, an exp-domain Sinkhorn, hand-computed values, finite differences."""

import itertools
import math

import pytest
import torch
from chart_references import rtbp_reference, split_reference, tbp_reference
from hypothesis import given, settings
from hypothesis import strategies as st

from geoformers.models.ddl_mhc.ops.charts import (
    METHODS,
    MHC_LITE_MAX_N,
    birkhoff,
    ds_violation,
    naive,
    num_logits,
    rtbp_logits_from_matrix,
    tbp_logits_from_matrix,
)
from geoformers.models.ddl_mhc.ops.charts.rtbp_node import schedule_node
from geoformers.models.ddl_mhc.ops.charts.tbp_node import tbp_node
from geoformers.models.ddl_mhc.ops.dispatch import ops_path

EXACT_METHODS = ("tbp", "rtbp", "mhc_lite", "kromhc")
SIZES = (*range(1, 10), 16, 32)
BATCH_SHAPES = ((), (7,), (2, 3, 5))
INVERSES = {"tbp": tbp_logits_from_matrix, "rtbp": rtbp_logits_from_matrix}
REFERENCES = {"tbp": tbp_reference, "rtbp": rtbp_reference}


def allows(method: str, n: int) -> bool:
    return not (method == "mhc_lite" and n > MHC_LITE_MAX_N) and not (method == "kromhc" and n & (n - 1))


EXACT_CASES = [(method, n) for method in EXACT_METHODS for n in SIZES if allows(method, n)]


def logits_for(method: str, n: int, shape: tuple, kind: str, generator: torch.Generator) -> torch.Tensor:
    """N(0, 3^2) logits, or extreme ones: +-50 with random signs."""
    size = (*shape, num_logits(method, n))
    if kind == "normal":
        return torch.randn(size, generator=generator, dtype=torch.float64) * 3
    return torch.where(torch.rand(size, generator=generator) < 0.5, -50.0, 50.0).double()


def assert_doubly_stochastic(x: torch.Tensor, n: int, tolerance: float) -> None:
    assert x.shape[-2:] == (n, n)
    assert float(ds_violation(x).max()) <= tolerance
    assert float(x.min()) >= -1e-7


def random_interior_ds(n: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """Strictly interior DS matrices: convex combinations of random permutation matrices and J/n."""
    eye = torch.eye(n, dtype=torch.float64)
    perms = torch.stack([eye[torch.randperm(n, generator=generator)] for _ in range(count * 4)])
    weights = torch.rand(count, 5, generator=generator, dtype=torch.float64) + 0.05
    weights = weights / weights.sum(-1, keepdim=True)
    mix = torch.einsum("bk,bkij->bij", weights[:, :4], perms.view(count, 4, n, n))
    return mix + weights[:, 4, None, None] / n


# ---------------------------------------------------------------------------------------------
# num_logits and the simple cases


@pytest.mark.parametrize(
    "method, n, expected",
    [
        ("tbp", 1, 0), ("tbp", 4, 9), ("rtbp", 5, 16), ("rtbp", 32, 961),
        ("sinkhorn", 1, 1), ("sinkhorn", 4, 16),
        ("mhc_lite", 1, 1), ("mhc_lite", 4, 24), ("mhc_lite", 6, 720),
        ("kromhc", 1, 0), ("kromhc", 2, 1), ("kromhc", 16, 4),
    ],
)  # fmt: skip
def test_num_logits(method, n, expected):
    assert num_logits(method, n) == expected


@pytest.mark.parametrize("method", METHODS)
def test_n_equal_one_gives_ones(method):
    logits = torch.randn(2, 3, num_logits(method, 1))
    x = birkhoff(logits, 1, method)
    assert x.shape == (2, 3, 1, 1) and x.dtype == torch.float32
    assert torch.equal(x, torch.ones(2, 3, 1, 1))


@pytest.mark.parametrize("method", METHODS)
def test_output_dtype_and_empty_batch(method):
    n = 4
    for dtype, expected in [
        (torch.float64, torch.float64),
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float32),
    ]:
        assert birkhoff(torch.zeros(3, num_logits(method, n), dtype=dtype), n, method).dtype == expected
    assert birkhoff(torch.zeros(0, num_logits(method, n)), n, method).shape == (0, n, n)


def test_hand_computed_n2_and_rtbp_centre():
    """n = 2: both charts give [[s, 1-s], [1-s, s]], s = sigmoid(t). Zero logits: RTBP gives J/n
    for n = 2^k (every interval is split in the middle); TBP at n = 3 by hand."""
    t = torch.tensor([[0.7], [-2.0]], dtype=torch.float64)
    s = torch.sigmoid(t)[:, 0]
    expected = torch.stack([torch.stack([s, 1 - s], -1), torch.stack([1 - s, s], -1)], -2)
    for method in ("tbp", "rtbp", "kromhc"):
        torch.testing.assert_close(birkhoff(t, 2, method), expected, rtol=0, atol=1e-15)
    for n in (4, 8, 16):
        zeros = torch.zeros(num_logits("rtbp", n), dtype=torch.float64)
        uniform = torch.full((n, n), 1.0 / n, dtype=torch.float64)
        torch.testing.assert_close(birkhoff(zeros, n, "rtbp"), uniform)
    # TBP, n = 3, zero logits: X00 = 1/2; X01 in [0, 1/2] -> 1/4; X10 in [0, 1/2] -> 1/4;
    # X11: r = 3/4, c = 3/4, capacity right = 1 - 1/4 = 3/4 -> [0, 3/4] -> 3/8.
    expected3 = torch.tensor([[4, 2, 2], [2, 3, 3], [2, 3, 3]], dtype=torch.float64) / 8
    torch.testing.assert_close(birkhoff(torch.zeros(4, dtype=torch.float64), 3, "tbp"), expected3)


# ---------------------------------------------------------------------------------------------
# Exactness


@pytest.mark.parametrize("method, n", EXACT_CASES)
def test_exact_in_float32_and_float64(method, n):
    generator = torch.Generator().manual_seed(n)
    for kind in ("normal", "extreme"):
        for shape in BATCH_SHAPES:
            logits = logits_for(method, n, shape, kind, generator)
            x64 = birkhoff(logits, n, method)
            assert x64.shape == (*shape, n, n) and x64.dtype == torch.float64
            assert_doubly_stochastic(x64, n, 1e-12)
            x32 = birkhoff(logits.float(), n, method)
            assert x32.dtype == torch.float32
            assert_doubly_stochastic(x32, n, 1e-6)


@pytest.mark.parametrize("method, n", EXACT_CASES)
def test_exact_under_bfloat16_autocast(method, n):
    generator = torch.Generator().manual_seed(100 + n)
    for kind in ("normal", "extreme"):
        for shape in BATCH_SHAPES:
            logits = logits_for(method, n, shape, kind, generator)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                for x in (birkhoff(logits.float(), n, method), birkhoff(logits.bfloat16(), n, method)):
                    assert x.dtype == torch.float32
                    assert_doubly_stochastic(x, n, 1e-6)


@pytest.mark.parametrize("method", ("tbp", "rtbp"))
def test_exact_float32_many_matrices_n32(method):
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(512, num_logits(method, 32), generator=generator) * 6
    logits[:128] = logits[:128].sign() * 50  # vertices' neighbourhoods
    logits[128:256] = -16.6  # sigmoid ~ 6e-8: entries below float32's resolution of 1
    assert_doubly_stochastic(birkhoff(logits, 32, method), 32, 1e-6)


@settings(max_examples=40, deadline=None)
@given(
    method=st.sampled_from(("tbp", "rtbp")),
    n=st.integers(1, 12),
    values=st.lists(st.floats(-60, 60, allow_nan=False), min_size=121, max_size=121),
)
def test_exact_for_arbitrary_logits(method, n, values):
    logits = torch.tensor(values[: num_logits(method, n)], dtype=torch.float32)
    assert_doubly_stochastic(birkhoff(logits, n, method), n, 1e-6)


def test_sinkhorn_violation_is_reported_and_decreases_with_iterations():
    logits = torch.randn(64, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2
    violations = [float(ds_violation(birkhoff(logits, 4, "sinkhorn", iters=k)).max()) for k in (1, 3, 10, 30)]
    assert violations[0] > 1e-3
    assert all(later < earlier for earlier, later in itertools.pairwise(violations))
    # Columns are normalised last, so the column sums are exact; the rows carry the violation.
    x = birkhoff(logits, 4, "sinkhorn", iters=3)
    torch.testing.assert_close(x.sum(-2), torch.ones(64, 4, dtype=torch.float64))


# ---------------------------------------------------------------------------------------------
# Independent references


@pytest.mark.parametrize("method", ("tbp", "rtbp"))
@pytest.mark.parametrize("n", (*range(2, 10), 16))
def test_fast_path_matches_float64_reference(method, n):
    generator = torch.Generator().manual_seed(n)
    logits = torch.randn(4, num_logits(method, n), generator=generator, dtype=torch.float64) * 3
    logits[0, ::3] = 40.0  # some intervals pinned to an end
    reference = torch.tensor([REFERENCES[method](row.tolist(), n) for row in logits], dtype=torch.float64)
    # the naive definition, the autograd nodes (each called directly) and the dispatcher
    naive_chart = {"tbp": naive.tbp, "rtbp": naive.rtbp}[method]
    nodes = [schedule_node(logits, n, method, torch.float64)]  # the schedule the Triton kernels run
    if method == "tbp":
        nodes.append(tbp_node(logits, n, torch.float64))
    for fast in (naive_chart(logits, n), *nodes, birkhoff(logits, n, method)):
        torch.testing.assert_close(fast, reference, rtol=0, atol=1e-10)


def _graph_names(tensor: torch.Tensor) -> set[str]:
    names, seen, todo = set(), set(), [tensor.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and id(node) not in seen:
            seen.add(id(node))
            names.add(type(node).__name__)
            todo.extend(next_node for next_node, _ in node.next_functions)
    return names


@pytest.mark.parametrize("method", METHODS)
def test_every_chart_follows_the_chosen_path(method):
    """Inside `ops_path("naive")` every chart runs its `naive.py` definition (no autograd node of its own in
    the graph); on the default path (CPU: the nodes) the same values and gradients, float64."""
    n = 4
    generator = torch.Generator().manual_seed(3)
    logits = (
        torch.randn(5, num_logits(method, n), generator=generator, dtype=torch.float64) * 2
    ).requires_grad_()
    projection = torch.randn(5, n, n, generator=generator, dtype=torch.float64)
    results = {}
    for path in ("node", "naive"):
        with ops_path(path):
            x = birkhoff(logits, n, method)
        nodes = {name for name in _graph_names(x) if name.endswith(("FunctionBackward", "ChartBackward"))}
        if path == "naive":
            assert not nodes, nodes
        results[path] = (x.detach(), torch.autograd.grad((x * projection).sum(), logits)[0], nodes)
    if method in ("tbp", "rtbp", "stbp", "mstbp", "atbp"):
        assert results["node"][2]  # these charts have a node, and the default path takes it
    torch.testing.assert_close(results["node"][0], results["naive"][0], rtol=0, atol=1e-12)
    torch.testing.assert_close(results["node"][1], results["naive"][1], rtol=0, atol=1e-10)


def test_split_reference_hand_computed():
    # capacities (1, 1, 1), total 1.5, zero logits: first two slots get [0.5, 1.5] -> 1.0 -> 0.5 each.
    assert split_reference([1.0, 1.0, 1.0], 1.5, [0.0, 0.0]) == [0.5, 0.5, 0.5]
    assert split_reference([1.0], 0.25, []) == [0.25]


def test_mhc_lite_and_kromhc_match_explicit_constructions():
    generator = torch.Generator().manual_seed(3)
    n = 4
    logits = torch.randn(5, math.factorial(n), generator=generator, dtype=torch.float64)
    weights = torch.softmax(logits, -1)
    eye = torch.eye(n, dtype=torch.float64)
    explicit = sum(
        weights[:, k, None, None] * eye[list(p)] for k, p in enumerate(itertools.permutations(range(n)))
    )
    torch.testing.assert_close(birkhoff(logits, n, "mhc_lite"), explicit)

    logits = torch.randn(5, 3, generator=generator, dtype=torch.float64)
    s = torch.sigmoid(logits)
    for b in range(5):
        factors = [torch.tensor([[v, 1 - v], [1 - v, v]], dtype=torch.float64) for v in s[b].tolist()]
        expected = torch.kron(torch.kron(factors[0], factors[1]), factors[2])
        torch.testing.assert_close(birkhoff(logits[b], 8, "kromhc"), expected)


def test_sinkhorn_matches_exp_domain_reference():
    logits = torch.randn(6, 9, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    k = logits.view(6, 3, 3).exp()
    for _ in range(7):
        k = k / k.sum(-1, keepdim=True)
        k = k / k.sum(-2, keepdim=True)
    torch.testing.assert_close(birkhoff(logits, 3, "sinkhorn", iters=7), k)


def test_ds_violation_hand_computed():
    x = torch.tensor([[0.5, 0.5], [0.25, 0.5]])
    # rows: 1.0, 0.75 -> 0.25; columns: 0.75, 1.0 -> 0.25
    assert float(ds_violation(x)) == pytest.approx(0.25)
    assert ds_violation(torch.eye(3).expand(4, 2, 3, 3)).shape == (4, 2)


# ---------------------------------------------------------------------------------------------
# Gradients


@pytest.mark.parametrize(
    "method, n, options",
    [
        *[("tbp", n, {}) for n in (2, 3, 4, 5, 6)],
        *[("rtbp", n, {}) for n in (2, 3, 4, 5, 6)],
        ("sinkhorn", 3, {"iters": 4}),
        ("mhc_lite", 3, {}),
        ("kromhc", 4, {}),
    ],
)
def test_gradcheck_float64(method, n, options):
    generator = torch.Generator().manual_seed(n)
    logits = torch.randn(2, 2, num_logits(method, n), generator=generator, dtype=torch.float64)
    logits.requires_grad_()
    assert torch.autograd.gradcheck(lambda t: birkhoff(t, n, method, **options), (logits,))


@pytest.mark.parametrize("method", ("tbp", "rtbp"))
def test_float32_gradient_matches_float64(method):
    n = 8
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(300, num_logits(method, n), generator=generator, dtype=torch.float64) * 2
    upstream = torch.randn(300, n, n, generator=generator, dtype=torch.float64)
    grads = []
    for dtype in (torch.float64, torch.float32):
        t = logits.to(dtype).detach().requires_grad_()
        (birkhoff(t, n, method) * upstream.to(dtype)).sum().backward()
        assert t.grad.dtype == dtype
        grads.append(t.grad.double())
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_finite_gradients_at_extreme_logits(method):
    n = 4
    for scale in (50.0, 1e4):
        signs = torch.randn(64, num_logits(method, n), generator=torch.Generator().manual_seed(6)).sign()
        logits = signs * scale
        logits.requires_grad_()
        x = birkhoff(logits, n, method)
        (x * torch.randn(64, n, n)).sum().backward()
        assert torch.isfinite(x).all() and torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("method", ("tbp", "rtbp", "sinkhorn"))
def test_training_at_large_learning_rate_stays_finite_and_exact(method):
    """Fit one chart to a target DS matrix with Adam at lr 1.0 (10x a usual 0.1): no NaN, still exact."""
    n = 6
    target = random_interior_ds(n, 1, torch.Generator().manual_seed(9))[0].float()
    logits = torch.zeros(32, num_logits(method, n), requires_grad=True)
    optimizer = torch.optim.Adam([logits], lr=1.0)
    for _ in range(30):
        loss = (birkhoff(logits, n, method) - target).square().sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert torch.isfinite(logits).all()
    if method != "sinkhorn":
        assert_doubly_stochastic(birkhoff(logits.detach(), n, method), n, 1e-6)


def test_autocast_backward_reaches_bfloat16_logits():
    logits = torch.randn(3, 5, 9).bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x = birkhoff(logits, 4, "tbp")
    x.square().sum().backward()
    assert logits.grad.dtype == torch.bfloat16 and torch.isfinite(logits.grad.float()).all()


# ---------------------------------------------------------------------------------------------
# Inverse charts


@pytest.mark.parametrize("method", ("tbp", "rtbp"))
@pytest.mark.parametrize("n", range(2, 9))
def test_inverse_round_trip(method, n):
    generator = torch.Generator().manual_seed(20 + n)
    matrices = random_interior_ds(n, 16, generator)
    logits = INVERSES[method](matrices)
    assert logits.shape == (16, num_logits(method, n)) and logits.dtype == torch.float64
    torch.testing.assert_close(birkhoff(logits, n, method), matrices, rtol=0, atol=1e-9)
    # The other direction: the chart is injective, so logits -> matrix -> logits is the identity.
    logits = torch.randn(16, num_logits(method, n), generator=generator, dtype=torch.float64) * 2
    torch.testing.assert_close(INVERSES[method](birkhoff(logits, n, method)), logits, rtol=0, atol=1e-6)


@pytest.mark.parametrize("method", ("tbp", "rtbp"))
def test_inverse_rejects_bad_matrices(method):
    inverse = INVERSES[method]
    with pytest.raises(ValueError, match="square"):
        inverse(torch.full((3, 4), 0.25))
    with pytest.raises(ValueError, match="> 0"):
        inverse(torch.eye(3))
    with pytest.raises(ValueError, match="row/column sum"):
        inverse(torch.full((3, 3), 0.5))
    with pytest.raises(ValueError, match="floating"):
        inverse(torch.ones(2, 2, dtype=torch.int64))
    with pytest.raises(TypeError, match="Tensor"):
        inverse([[0.5, 0.5], [0.5, 0.5]])


# ---------------------------------------------------------------------------------------------
# Bad input


def test_bad_input_raises_clear_errors():
    good = torch.zeros(9)
    with pytest.raises(ValueError, match="method must be one of .*tbp.*rtbp.*sinkhorn.*mhc_lite.*kromhc"):
        birkhoff(good, 4, "birkhoff")
    with pytest.raises(ValueError, match="n must be >= 1"):
        num_logits("tbp", 0)
    with pytest.raises(TypeError, match="n must be an int"):
        birkhoff(good, 4.0, "tbp")
    with pytest.raises(ValueError, match="power of two"):
        num_logits("kromhc", 6)
    with pytest.raises(ValueError, match=r"n <= 6 \(720 logits"):
        num_logits("mhc_lite", 7)
    with pytest.raises(ValueError, match=r"expects logits of shape \(\.\.\., 16\)"):
        birkhoff(good, 4, "sinkhorn")
    with pytest.raises(ValueError, match=r"\(\.\.\., 9\)"):
        birkhoff(torch.tensor(1.0), 4, "tbp")
    with pytest.raises(ValueError, match="floating dtype"):
        birkhoff(torch.zeros(9, dtype=torch.int64), 4, "tbp")
    with pytest.raises(ValueError, match="NaN or infinite"):
        birkhoff(torch.tensor([0.0] * 8 + [float("nan")]), 4, "tbp")
    with pytest.raises(ValueError, match="NaN or infinite"):
        birkhoff(torch.tensor([0.0] * 8 + [float("inf")]), 4, "rtbp")
    with pytest.raises(TypeError, match="torch.Tensor"):
        birkhoff([0.0] * 9, 4, "tbp")
    with pytest.raises(ValueError, match="iters must be an int >= 1"):
        birkhoff(torch.zeros(16), 4, "sinkhorn", iters=0)
    with pytest.raises(TypeError, match="unexpected options"):
        birkhoff(good, 4, "tbp", iters=5)


def test_large_finite_logits_are_not_mistaken_for_non_finite():
    logits = torch.full((9,), 3e38)  # the float64 sum check must not overflow
    assert_doubly_stochastic(birkhoff(logits, 4, "tbp"), 4, 1e-6)


# ---------------------------------------------------------------------------------------------
# Finite, non-negative, attached to the graph at every input


@pytest.mark.parametrize(
    ("dtype", "scale"), [(torch.float32, 2e38), (torch.float32, 3.4e38), (torch.float64, 1e308)]
)
@pytest.mark.parametrize("n", (2, 4, 7))
def test_sinkhorn_is_finite_for_every_finite_logit(dtype, scale, n):
    """Logits of both signs near the dtype's largest finite value: a finite matrix with entries in
    [0, 1] and unit column sums (columns are normalised last), and finite gradients."""
    generator = torch.Generator().manual_seed(n)
    signs = torch.randn(64, n * n, generator=generator).sign().to(dtype)
    logits = torch.cat([signs * scale, torch.full((1, n * n), -scale, dtype=dtype)])
    logits[-1, 0] = scale  # one matrix whose other rows hold nothing but the most negative logit
    logits.requires_grad_()
    x = birkhoff(logits, n, "sinkhorn")
    assert torch.isfinite(x).all() and float(x.detach().min()) >= 0 and float(x.detach().max()) <= 1
    torch.testing.assert_close(x.sum(-2), torch.ones(65, n, dtype=dtype))
    (x * torch.randn(65, n, n, generator=generator, dtype=dtype)).sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_sinkhorn_ignores_a_constant_shift_of_a_matrix_logits():
    """The max shift that keeps huge logits finite changes nothing: exp(logits + c) is the same chart."""
    logits = torch.randn(32, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 3
    shift = torch.linspace(-1e3, 1e3, 32, dtype=torch.float64)[:, None]
    torch.testing.assert_close(birkhoff(logits + shift, 4, "sinkhorn"), birkhoff(logits, 4, "sinkhorn"))


def test_sinkhorn_error_table_beside_its_iteration_count_is_measured():
    """The table beside SINKHORN_DEFAULT_ITERS in naive.py (median / max |row sum - 1|), recomputed."""
    documented = {
        4: ((7.5e-8, 1.6e-7), (7.5e-8, 1.3e-4), (2.4e-4, 4.7e-2), (2.9e-2, 3.7e-1)),
        8: ((9.7e-8, 2.5e-7), (1.0e-7, 1.7e-6), (3.4e-4, 5.5e-2), (5.2e-2, 4.9e-1)),
        16: ((1.9e-7, 3.3e-7), (1.5e-7, 1.6e-6), (3.1e-4, 4.6e-2), (6.7e-2, 4.6e-1)),
    }
    generator = torch.Generator().manual_seed(0)
    for n in (2, 4, 8, 16):
        for column, scale in enumerate((0.1, 1, 3, 10)):
            violation = ds_violation(
                birkhoff(torch.randn(4096, n * n, generator=generator) * scale, n, "sinkhorn")
            )
            if n in documented:
                median, worst = documented[n][column]
                assert float(violation.median()) == pytest.approx(median, rel=0.07), (n, scale)
                assert float(violation.max()) == pytest.approx(worst, rel=0.07), (n, scale)


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
@pytest.mark.parametrize("method", ("tbp", "rtbp"))
def test_exact_chart_entries_are_nonnegative_exactly(method, dtype):
    """Saturated logits drive entries to 0, where the remainders used to round to about -2e-15."""
    generator = torch.Generator().manual_seed(11)
    for n in (3, 8, 13):
        logits = (torch.randn(4000, num_logits(method, n), generator=generator, dtype=torch.float64) * 20).to(
            dtype
        )
        x = birkhoff(logits, n, method)
        assert float(x.min()) >= 0.0
        assert_doubly_stochastic(x, n, 1e-6 if dtype == torch.float32 else 1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_n_equal_one_stays_on_the_autograd_graph(method):
    logits = torch.zeros(3, num_logits(method, 1), requires_grad=True)
    x = birkhoff(logits, 1, method)
    assert x.grad_fn is not None and torch.equal(x.detach(), torch.ones(3, 1, 1))
    x.sum().backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))
