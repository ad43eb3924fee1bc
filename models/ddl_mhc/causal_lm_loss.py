"""Next-token cross-entropy of the causal LM: transformers' `ForCausalLMLoss` with a defined value when no
token is scored.

`ForCausalLMLoss` averages over the scored tokens (labels != -100, after the shift), or divides the sum by
`num_items_in_batch` under gradient accumulation; with no scored token at all (every label -100, a one-token
sequence, or `num_items_in_batch` = 0) that is 0 / 0 = NaN. Here the count is floored at 1, so such a batch
has loss 0 (the empty sum) and zero gradient, and every other batch the same loss as transformers' helper.
"""

import torch
import torch.nn.functional as F
from transformers.loss.loss_utils import ForCausalLMLoss


def causal_lm_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab_size: int,
    num_items_in_batch: torch.Tensor | int | None = None,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
    **kwargs,
) -> torch.Tensor:
    """Mean next-token cross-entropy over the scored tokens (sum / `num_items_in_batch` when given); 0 when
    no token is scored."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:].contiguous()
    if num_items_in_batch is None:
        num_items_in_batch = (shift_labels != ignore_index).sum()
    if isinstance(num_items_in_batch, torch.Tensor):
        count = num_items_in_batch.clamp_min(1)
    else:
        count = max(num_items_in_batch, 1)
    return ForCausalLMLoss(
        logits,
        labels,
        vocab_size,
        num_items_in_batch=count,
        ignore_index=ignore_index,
        shift_labels=shift_labels,
        **kwargs,
    )
