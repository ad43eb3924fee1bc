"""The host path of the transport charts (`models/ddl_mhc/ops/charts/host.py`, docs/ddl_mhc.md, 'Choosing a
path'): every TBP / RTBP variant against its `naive.py` definition in float64 and after rounding to float32,
and the rule that picks it (a few CPU rows without a gradient, eager) or leaves it."""

import pytest
import torch

import geoformers
from geoformers.models.ddl_mhc.ops import charts
from geoformers.models.ddl_mhc.ops.charts import HOST_POINTS, birkhoff
from geoformers.models.ddl_mhc.ops.charts.host import host_chart
from geoformers.models.ddl_mhc.ops.charts.naive import INTERVAL_CHOICES, rtbp, tbp
from geoformers.models.ddl_mhc.ops.dispatch import ops_path

NAIVE = {"tbp": tbp, "rtbp": rtbp}


@pytest.mark.parametrize("base", ["tbp", "rtbp"])
@pytest.mark.parametrize("interval", sorted(INTERVAL_CHOICES))
@pytest.mark.parametrize("n", [2, 3, 4, 6])
@pytest.mark.parametrize("scale", [1.0, 3.0, 50.0])
def test_the_host_chart_is_the_naive_chart(base, interval, n, scale):
    """float64 logits to rounding (1e-13); float32 logits give the float64 chart rounded once."""
    choice = INTERVAL_CHOICES[interval]
    logits = scale * torch.randn(
        5, (n - 1) ** 2, dtype=torch.float64, generator=torch.Generator().manual_seed(n)
    )
    expected = NAIVE[base](logits, n, choice)
    torch.testing.assert_close(host_chart(logits, n, base, choice), expected, rtol=0, atol=1e-13)
    single = logits.float()
    rounded = NAIVE[base](single.double(), n, choice).clamp_min(0).float()
    torch.testing.assert_close(host_chart(single, n, base, choice), rounded, rtol=0, atol=2e-7)


@pytest.fixture
def host_calls(monkeypatch) -> list[int]:
    calls = []
    original = charts.host_chart
    monkeypatch.setattr(
        charts, "host_chart", lambda flat, *a: calls.append(flat.shape[0]) or original(flat, *a)
    )
    return calls


def test_the_rule_takes_the_host_path_only_for_a_few_cpu_rows_without_a_gradient(host_calls):
    most = HOST_POINTS // 9  # rows at n = 4
    assert (most, HOST_POINTS // 49, HOST_POINTS // 64) == (5, 1, 0)  # n = 4, 8, 9
    few = torch.randn(1, most, 9)
    with torch.no_grad():
        birkhoff(few, 4, "rtbp")
        birkhoff(torch.randn(most + 1, 9), 4, "rtbp")  # more rows: the node
        birkhoff(torch.randn(2, 49), 8, "rtbp")
        birkhoff(torch.randn(1, 64), 9, "tbp")
        birkhoff(torch.randn(1, 16), 4, "sinkhorn")  # no host path
        birkhoff(torch.randn(1, 2 * 10), 4, "atbp")
        with ops_path("node"):
            birkhoff(few, 4, "tbp")
        with ops_path("host"):
            birkhoff(torch.randn(8, 9), 4, "tbp")  # any row count when asked
    birkhoff(few.requires_grad_(), 4, "rtbp")  # a gradient: the node
    assert host_calls == [most, 8]


def test_the_host_path_has_no_graph_and_compiles_to_the_node(host_calls):
    logits = torch.randn(1, 9, requires_grad=True)
    x = birkhoff(logits, 4, "rtbp")
    assert x.grad_fn is not None and host_calls == []
    with torch.no_grad():
        assert birkhoff(logits, 4, "rtbp").grad_fn is None
    assert host_calls == [1]
    compiled = torch.compile(lambda t: birkhoff(t, 4, "rtbp"), backend="eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(logits.detach()), x.detach(), rtol=0, atol=0)
    assert host_calls == [1]  # traced: the node


def test_greedy_decoding_is_the_same_on_the_host_path_and_the_node():
    torch.manual_seed(0)
    config = geoformers.DDLmHCConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        hc_streams=4, residual="delta",
    )  # fmt: skip
    model = geoformers.DDLmHCForCausalLM(config).eval()
    prompt = torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        host = model.generate(prompt, max_new_tokens=12, do_sample=False)
        with ops_path("node"):
            node = model.generate(prompt, max_new_tokens=12, do_sample=False)
            logits_node = model(host).logits
        logits_host = model(host).logits
    assert torch.equal(host, node)
    torch.testing.assert_close(logits_host, logits_node, rtol=0, atol=1e-6)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_logit_is_refused_on_the_host_path_as_on_the_node(bad, host_calls):
    logits = torch.zeros(1, 9)
    logits[0, 4] = bad
    for path in ("host", "node"):
        with torch.no_grad(), ops_path(path), pytest.raises(ValueError, match="NaN or infinite"):
            birkhoff(logits, 4, "rtbp")
    assert host_calls == [1]
