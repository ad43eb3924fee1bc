"""`compute_metrics` for `transformers.Trainer`: accuracy for sequence classification, next-token accuracy
and perplexity for a causal LM (plain numpy functions: no `evaluate` module, no download)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # label of tokens without a loss (transformers' convention)


def accuracy(predictions, references) -> dict[str, float]:
    """The fraction of predictions equal to the references."""
    return {"accuracy": float(np.mean(np.asarray(predictions) == np.asarray(references)))}


def perplexity(losses) -> dict[str, float]:
    """exp of the mean per-token negative log-likelihood (natural log; every token weighs the same)."""
    losses = np.asarray(losses, dtype=np.float64)
    if losses.size == 0:
        raise ValueError("losses is empty: perplexity needs at least one scored token")
    if np.isnan(losses).any():
        raise ValueError(f"losses holds {int(np.isnan(losses).sum())} NaN values")
    if losses.min() < 0:
        raise ValueError(f"losses must be non-negative log-likelihoods, got {losses.min()}")
    return {"perplexity": float(np.exp(losses.mean()))}


def classification_metrics():
    """A `compute_metrics` function for `transformers.Trainer` on sequence classification."""

    def compute_metrics(eval_prediction) -> dict[str, float]:
        logits = eval_prediction.predictions
        logits = logits[0] if isinstance(logits, tuple) else logits
        return accuracy(np.argmax(logits, axis=-1), eval_prediction.label_ids)

    return compute_metrics


def causal_lm_metrics() -> dict:
    """`Trainer` keyword arguments for a causal LM: next-token `accuracy` and `perplexity` over the shifted
    targets whose label is not -100.

    `Trainer(..., **causal_lm_metrics())`. Its `preprocess_logits_for_metrics` reduces each batch's logits to
    (argmax, token negative log-likelihood), so evaluation never holds (tokens x vocab) logits. The perplexity
    weighs every scored token equally; `eval_loss` averages per-batch mean losses weighted by rows, so
    exp(eval_loss) equals it only when every row scores as many tokens (unpadded `causal_lm_blocks`).
    """

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
            **accuracy(next_tokens[scored], targets[scored]),
            **perplexity(token_losses[scored]),
        }

    return dict(compute_metrics=compute_metrics, preprocess_logits_for_metrics=preprocess_logits_for_metrics)
