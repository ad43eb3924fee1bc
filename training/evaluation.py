"""Metrics through `evaluate` from modules shipped in this package (no hub download at run time)."""

from __future__ import annotations

from pathlib import Path

import evaluate
import numpy as np

METRIC_MODULES = Path(__file__).resolve().parent / "metric_modules"


def load_metric(name: str) -> evaluate.EvaluationModule:
    """`evaluate.load` of a metric module shipped in `training/metric_modules/<name>/`."""
    available = sorted(p.name for p in METRIC_MODULES.iterdir() if (p / f"{p.name}.py").is_file())
    if name not in available:
        raise ValueError(f"unknown metric {name!r}; shipped metrics: {available}")
    return evaluate.load(str(METRIC_MODULES / name / f"{name}.py"))


def classification_metrics():
    """A `compute_metrics` function for `transformers.Trainer` on sequence classification."""
    accuracy = load_metric("accuracy")

    def compute_metrics(eval_prediction) -> dict[str, float]:
        logits = eval_prediction.predictions
        logits = logits[0] if isinstance(logits, tuple) else logits
        return accuracy.compute(predictions=np.argmax(logits, axis=-1), references=eval_prediction.label_ids)

    return compute_metrics
