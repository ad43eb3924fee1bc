"""Metrics through `evaluate` from modules shipped in this package (no hub download at run time)."""

from __future__ import annotations

from pathlib import Path

import evaluate
import numpy as np
import torch
import torch.nn.functional as F

METRIC_MODULES = Path(__file__).resolve().parent / "metric_modules"
IGNORE_INDEX = -100  # label of tokens without a loss (transformers' convention)


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


def causal_lm_metrics() -> dict:
    """`Trainer` keyword arguments for a causal LM: next-token accuracy and perplexity through the shipped
    `accuracy` and `perplexity` modules, over the shifted targets whose label is not -100.

    `Trainer(..., **causal_lm_metrics())`. Its `preprocess_logits_for_metrics` reduces each batch's logits to
    (argmax, token negative log-likelihood), so evaluation never holds (tokens x vocab) logits. The perplexity
    weighs every scored token equally; `eval_loss` averages per-batch mean losses weighted by rows, so
    exp(eval_loss) equals it only when every row scores as many tokens (unpadded `causal_lm_blocks`).
    """
    accuracy, perplexity = load_metric("accuracy"), load_metric("perplexity")

    def preprocess_logits_for_metrics(logits, labels) -> tuple[torch.Tensor, torch.Tensor]:
        logits = logits[0] if isinstance(logits, tuple) else logits
        if labels is None:
            raise ValueError("labels are missing: DataCollatorForLanguageModeling(mlm=False) adds them")
        shifted_logits, targets = logits[:, :-1].float(), labels[:, 1:]
        token_losses = F.cross_entropy(
            shifted_logits.transpose(1, 2), targets, ignore_index=IGNORE_INDEX, reduction="none"
        )
        return shifted_logits.argmax(dim=-1), token_losses

    def compute_metrics(eval_prediction) -> dict[str, float]:
        predictions = eval_prediction.predictions
        if not (isinstance(predictions, tuple) and len(predictions) == 2):
            raise ValueError(
                "predictions must be (next tokens, token losses) from causal_lm_metrics' own "
                "preprocess_logits_for_metrics: pass both with Trainer(..., **causal_lm_metrics()) and keep "
                "eval_do_concat_batches=True"
            )
        next_tokens, token_losses = predictions
        targets = eval_prediction.label_ids[:, 1:]
        scored = targets != IGNORE_INDEX
        if not scored.any():
            raise ValueError("no evaluation token has a label other than -100: nothing to score")
        return {
            **accuracy.compute(predictions=next_tokens[scored], references=targets[scored]),
            **perplexity.compute(losses=token_losses[scored]),
        }

    return dict(compute_metrics=compute_metrics, preprocess_logits_for_metrics=preprocess_logits_for_metrics)
