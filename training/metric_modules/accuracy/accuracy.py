"""Accuracy as an `evaluate` metric module shipped with geoformers (no hub download at run time)."""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "Accuracy: the fraction of predictions equal to the references."
_CITATION = ""
_KWARGS_DESCRIPTION = """
Args:
    predictions (list of int): predicted labels.
    references (list of int): true labels.
    normalize (bool): return the fraction (default) instead of the count of correct predictions.
Returns:
    accuracy (float)
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}
            ),
        )

    def _compute(self, predictions, references, normalize=True):
        correct = np.asarray(predictions) == np.asarray(references)
        return {"accuracy": float(correct.mean()) if normalize else int(correct.sum())}
