"""Perplexity from per-token losses as an `evaluate` metric module shipped with geoformers (no hub download).

The hub's `perplexity` metric loads a model by name and scores texts; this one takes the per-token negative
log-likelihoods a causal LM already computed, so any local model (and `Trainer` evaluation) can use it.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "Perplexity: exp of the mean per-token negative log-likelihood (every token weighs the same)."
_CITATION = ""
_KWARGS_DESCRIPTION = """
Args:
    losses (list of float): negative log-likelihood (natural log) of each scored token, >= 0.
Returns:
    perplexity (float): exp(mean(losses)).
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Perplexity(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"losses": datasets.Value("float64")}),
        )

    def _compute(self, losses):
        losses = np.asarray(losses, dtype=np.float64)
        if losses.size == 0:
            raise ValueError("losses is empty: perplexity needs at least one scored token")
        if np.isnan(losses).any():
            raise ValueError(f"losses holds {int(np.isnan(losses).sum())} NaN values")
        if losses.min() < 0:
            raise ValueError(f"losses must be non-negative log-likelihoods, got {losses.min()}")
        return {"perplexity": float(np.exp(losses.mean()))}
