"""The Trainer metrics of `training/evaluation.py`, checked against scikit-learn and hand computation."""

import math

import numpy as np
import pytest
from sklearn.metrics import accuracy_score
from transformers import EvalPrediction

from geoformers.training.evaluation import accuracy, classification_metrics, perplexity


def test_accuracy_matches_sklearn():
    rng = np.random.default_rng(0)
    predictions, references = rng.integers(0, 3, 200), rng.integers(0, 3, 200)
    result = accuracy(predictions, references)
    assert result["accuracy"] == pytest.approx(accuracy_score(references, predictions), abs=1e-12)


def test_perplexity_is_exp_of_the_mean_loss_and_rejects_bad_losses():
    losses = [0.25, 1.5, 3.0, 0.0]
    assert perplexity(losses)["perplexity"] == pytest.approx(math.exp(4.75 / 4), rel=1e-15)
    for bad, match in (([], "losses is empty"), ([1.0, -0.5], "non-negative"), ([1.0, math.nan], "NaN")):
        with pytest.raises(ValueError, match=match):
            perplexity(bad)


def test_trainer_compute_metrics_takes_argmax_of_logits():
    logits = np.array([[0.1, 0.9], [2.0, 1.0], [0.0, 3.0], [5.0, -1.0]])
    labels = np.array([1, 0, 0, 0])
    result = classification_metrics()(EvalPrediction(predictions=(logits,), label_ids=labels))
    assert result == {"accuracy": 0.75}
