"""The chart table (docs/ddl_mhc.md, 'Doubly-stochastic charts'; docs/chart_variants.md): every chart name
`hc_chart` accepts, as a `ChartSpec`. The config's validation and `ops/charts` (which implements the charts)
derive all their lists from `CHARTS`. This module imports nothing, so the configuration does not
import the modeling package."""

from typing import NamedTuple

TRANSPORT_CHARTS = ("tbp", "rtbp")  # the charts built from interval points x = L + (U - L) f(t)


class ChartSpec(NamedTuple):
    """A chart: its `base` chart (itself a row of CHARTS), the `interval` choice of a transport base, and the
    row/column `orderings` whose conjugated charts are averaged with softmax weights (one ordering: the base
    chart itself). How a transport chart places each point in its interval [L, U] (docs/chart_variants.md):
    "plain" f = sigmoid(t); "scaled" f = sigmoid(beta t / (U - L + eps)); "margined" the scaled f in
    [rho, 1 - rho]."""

    base: str
    interval: str = "plain"
    orderings: tuple[str, ...] = ("direct",)


CHARTS = {
    "tbp": ChartSpec("tbp"),
    "rtbp": ChartSpec("rtbp"),
    "sinkhorn": ChartSpec("sinkhorn"),
    "mhc_lite": ChartSpec("mhc_lite"),
    "kromhc": ChartSpec("kromhc"),
    # the TBP-mHC authors' variants (docs/chart_variants.md)
    "stbp": ChartSpec("tbp", "scaled"),
    "srtbp": ChartSpec("rtbp", "scaled"),
    "mstbp": ChartSpec("tbp", "margined"),
    "msrtbp": ChartSpec("rtbp", "margined"),
    "atbp": ChartSpec("tbp", orderings=("direct", "reverse")),
}
METHODS = tuple(CHARTS)
CHART_VARIANTS = tuple(name for name, spec in CHARTS.items() if name != spec.base)
MHC_LITE_MAX_N = 6  # mhc_lite enumerates all n! permutation matrices
