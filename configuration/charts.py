"""Names of the doubly-stochastic charts (docs/ddl_mhc.md, 'Doubly-stochastic charts'), defined once for the
config's validation and `modeling/ops/charts`, which implements them. This module imports nothing, so the
configuration does not import the modeling package."""

METHODS = ("tbp", "rtbp", "sinkhorn", "mhc_lite", "kromhc", "stbp", "srtbp", "mstbp", "msrtbp", "atbp")
MHC_LITE_MAX_N = 6  # mhc_lite enumerates all n! permutation matrices
