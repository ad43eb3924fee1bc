"""Metrics shipped as local `evaluate` modules, checked against scikit-learn."""

import numpy as np
import pytest
from sklearn.metrics import accuracy_score
from transformers import EvalPrediction

from geoformers.training.evaluation import classification_metrics, load_metric


def test_accuracy_module_matches_sklearn():
    rng = np.random.default_rng(0)
    predictions, references = rng.integers(0, 3, 200), rng.integers(0, 3, 200)
    result = load_metric("accuracy").compute(predictions=predictions, references=references)
    assert result["accuracy"] == pytest.approx(accuracy_score(references, predictions), abs=1e-12)


def test_trainer_compute_metrics_takes_argmax_of_logits():
    logits = np.array([[0.1, 0.9], [2.0, 1.0], [0.0, 3.0], [5.0, -1.0]])
    labels = np.array([1, 0, 0, 0])
    result = classification_metrics()(EvalPrediction(predictions=(logits,), label_ids=labels))
    assert result == {"accuracy": 0.75}


def test_unknown_metric_names_the_shipped_ones():
    with pytest.raises(ValueError, match="shipped metrics: \\['accuracy', 'perplexity'\\]"):
        load_metric("bleu")
