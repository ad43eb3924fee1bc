"""Checks of a causal LM's forward arguments: a `ValueError`/`TypeError` naming the argument instead of an
index or shape error deep inside torch, or a silently different answer (docs/reliability.md, 'Arguments').

Policies: integer `input_ids`/`labels` of any width are converted to int64 (bool is refused: it is a mask,
not token ids); floating `inputs_embeds` are converted to the model's dtype, as `embed_tokens(input_ids)`
would produce them; a 2-D `attention_mask` holds 0/1 (bool, integer or float); empty batches and sequences
are refused. Checks that read tensor values (id ranges, mask values, finite embeddings) need a host sync: they
run where `value_checks.checks_values` allows (CPU tensors by default, never while compiling).
"""

import math

import torch
from transformers.cache_utils import Cache
from transformers.generation.continuous_batching import PagedAttentionCache

from geoformers.models.value_checks import checks_values

IGNORE_INDEX = -100  # transformers' label value for "not scored"


def _shape(tensor: torch.Tensor) -> tuple[int, ...]:
    return tuple(tensor.shape)


LIST_VALUES = 1024  # up to this many values a check reads as a Python list, not through kernels


def _value_range(tensor: torch.Tensor) -> list:
    """[min, max] of a non-empty tensor, with one host copy: up to LIST_VALUES values (a decoding step's ids
    and mask) as a Python list, no kernel at all; more through `aminmax` and `stack`."""
    if tensor.numel() <= LIST_VALUES:
        values = tensor.flatten().tolist()
        return [min(values), max(values)]
    return torch.stack(torch.aminmax(tensor)).tolist()


def check_token_ids(input_ids, vocab_size: int) -> torch.Tensor:
    """(batch, seq) ids in [0, vocab_size) -> int64."""
    integer = isinstance(input_ids, torch.Tensor) and not input_ids.is_floating_point()
    if not integer or input_ids.is_complex() or input_ids.dtype == torch.bool:
        got = getattr(input_ids, "dtype", type(input_ids).__name__)
        raise TypeError(f"`input_ids` must be an integer tensor, got {got}")
    if input_ids.ndim != 2:
        raise ValueError(f"`input_ids` must have shape (batch, seq), got {_shape(input_ids)}")
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"`input_ids` must hold at least one token per row, got shape {_shape(input_ids)}")
    if checks_values(input_ids):
        low, high = _value_range(input_ids)
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"`input_ids` must lie in [0, vocab_size={vocab_size}), got values in [{low}, {high}]"
            )
    return input_ids.long()


def embeds_bound(dtype: torch.dtype, num_streams: int, hidden_size: int) -> float:
    """Largest |inputs_embeds| accepted: half the magnitude at which the squared norm of a token's
    streams (n x hidden values, summed in at least float32 by the norms) overflows the compute dtype,
    and at most half of `dtype`'s largest value. Beyond it RMSNorm returns 0 and the model NaN."""
    compute = torch.promote_types(dtype, torch.float32)
    return min(math.sqrt(torch.finfo(compute).max / (num_streams * hidden_size)), torch.finfo(dtype).max) / 2


def check_inputs_embeds(inputs_embeds, hidden_size: int, dtype: torch.dtype, bound: float) -> torch.Tensor:
    """(batch, seq, hidden) finite floats with |value| <= bound -> `dtype`."""
    if not isinstance(inputs_embeds, torch.Tensor) or not inputs_embeds.is_floating_point():
        got = getattr(inputs_embeds, "dtype", type(inputs_embeds).__name__)
        raise TypeError(f"`inputs_embeds` must be a floating-point tensor, got {got}")
    if inputs_embeds.ndim != 3 or inputs_embeds.shape[-1] != hidden_size:
        raise ValueError(
            f"`inputs_embeds` must have shape (batch, seq, {hidden_size}), got {_shape(inputs_embeds)}"
        )
    if inputs_embeds.shape[0] == 0 or inputs_embeds.shape[1] == 0:
        raise ValueError(f"`inputs_embeds` must hold at least one token per row, got {_shape(inputs_embeds)}")
    if checks_values(inputs_embeds):
        peak = float(inputs_embeds.detach().abs().amax())
        if not math.isfinite(peak):
            raise ValueError("`inputs_embeds` contains NaN or infinite values")
        if peak > bound:
            raise ValueError(
                f"`inputs_embeds` reaches |value| = {peak:.3g}, above {bound:.3g}: the model's {dtype} "
                "norms of such states overflow"
            )
    return inputs_embeds.to(dtype)


def check_cache(cache) -> int:
    """A transformers `Cache`, or continuous batching's `PagedAttentionCache` (whose requests carry their own
    positions); returns the cached length the positions and the mask continue from (0 for the paged cache)."""
    if cache is None or isinstance(cache, PagedAttentionCache):
        return 0
    if not isinstance(cache, Cache):
        raise TypeError(
            "`cache` (`past_key_values`) must be a transformers `Cache`, e.g. "
            f"`DynamicCache(config=model.config)`, or continuous batching's `PagedAttentionCache`, got "
            f"{type(cache).__name__}"
        )
    return cache.get_seq_length()


def check_attention_mask(
    attention_mask,
    batch: int,
    length: int,
    past_length: int,
    cache: Cache | None,
    num_heads: int,
    attn_implementation: str | None,
) -> None:
    """2-D (batch, past + seq) padding mask of 0/1, or a prepared 4-D mask (batch or 1, heads or 1, seq,
    key length): bool (True = attend; not with eager attention, which adds the mask) or additive float.
    The per-layer-type dict that `generate` prepares for static caches is passed through."""
    if attention_mask is None or isinstance(attention_mask, dict):
        return
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"`attention_mask` must be a tensor, got {type(attention_mask).__name__}")
    if attention_mask.is_complex():
        raise TypeError(f"`attention_mask` must be bool, integer or float, got {attention_mask.dtype}")
    if attention_mask.ndim == 2:
        expected = (batch, past_length + length)
        if _shape(attention_mask) != expected:
            raise ValueError(
                f"`attention_mask` must have shape (batch, past + seq) = {expected}, "
                f"got {_shape(attention_mask)}"
            )
        if attention_mask.dtype != torch.bool and checks_values(attention_mask):
            if attention_mask.is_floating_point():
                other = bool(((attention_mask != 0) & (attention_mask != 1)).any())
            else:  # integers are 0/1 exactly when they lie in [0, 1]
                low, high = _value_range(attention_mask)
                other = low < 0 or high > 1
            if other:
                raise ValueError(
                    "`attention_mask` must hold only 0 (padding) and 1 (token); other values (e.g. 0.5, 2, "
                    "-1, NaN) would mean one thing to attention and another to the stream expansion"
                )
        return
    if attention_mask.ndim != 4:
        raise ValueError(
            "`attention_mask` must be 2-D (batch, past + seq) or a prepared 4-D (batch, heads, seq, keys) "
            f"mask, got shape {_shape(attention_mask)}"
        )
    rows, heads, queries, columns = attention_mask.shape
    if isinstance(cache, PagedAttentionCache):  # keys: the pages continuous batching reads for this step
        keys = columns
    else:
        keys = cache.get_mask_sizes(length, 0)[0] if cache is not None else length
    if rows not in (1, batch) or heads not in (1, num_heads) or queries != length or columns != keys:
        raise ValueError(
            f"a 4-D `attention_mask` must have shape (1 or {batch}, 1 or {num_heads}, {length}, {keys}), "
            f"got {_shape(attention_mask)}"
        )
    if attention_mask.dtype == torch.bool:
        if attn_implementation == "eager":
            raise ValueError(
                "a 4-D bool `attention_mask` needs sdpa/flex attention: eager attention adds the mask, so "
                "pass an additive float mask (0 = attend, a large negative value = masked)"
            )
    elif not attention_mask.is_floating_point():
        raise TypeError(
            f"a 4-D `attention_mask` must be bool or an additive float mask, got {attention_mask.dtype}"
        )


def check_position_ids(position_ids, batch: int, length: int) -> None:
    if position_ids is None:
        return
    if (
        not isinstance(position_ids, torch.Tensor)
        or position_ids.is_floating_point()
        or position_ids.is_complex()
    ):
        got = getattr(position_ids, "dtype", type(position_ids).__name__)
        raise TypeError(f"`position_ids` must be an integer tensor, got {got}")
    if position_ids.ndim != 2 or position_ids.shape[0] not in (1, batch) or position_ids.shape[1] != length:
        raise ValueError(
            f"`position_ids` must have shape (1 or batch, seq) = (1 or {batch}, {length}), "
            f"got {_shape(position_ids)}"
        )


def check_labels(
    labels, expected_shape: tuple[int, int] | None, vocab_size: int, logits_to_keep
) -> torch.Tensor:
    """(batch, seq) ids in [0, vocab_size) or -100 (not scored), matching the inputs -> int64."""
    if not isinstance(labels, torch.Tensor) or labels.is_floating_point() or labels.is_complex():
        got = getattr(labels, "dtype", type(labels).__name__)
        raise TypeError(f"`labels` must be an integer tensor of token ids, got {got}")
    if labels.dtype == torch.bool:
        raise TypeError("`labels` must be an integer tensor of token ids, got torch.bool")
    if expected_shape is not None and _shape(labels) != tuple(expected_shape):
        raise ValueError(
            f"`labels` must have shape (batch, seq) = {tuple(expected_shape)}, got {_shape(labels)}"
        )
    if not (isinstance(logits_to_keep, int) and logits_to_keep == 0):
        raise ValueError("`logits_to_keep` must be 0 when `labels` are given: the loss scores every position")
    if labels.numel() > 0 and checks_values(labels):
        scored = torch.where(labels == IGNORE_INDEX, 0, labels)
        low, high = _value_range(scored)
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"`labels` must lie in [0, vocab_size={vocab_size}) or be {IGNORE_INDEX} (not scored), "
                f"got values in [{low}, {high}]"
            )
    return labels.long()


def check_logits_to_keep(logits_to_keep) -> None:
    """Llama's `logits_to_keep`: an int >= 0 (0 keeps every position, k > 0 the last k) or a 1-D integer
    tensor of the sequence positions to keep."""
    if isinstance(logits_to_keep, torch.Tensor):
        if (
            logits_to_keep.ndim != 1
            or logits_to_keep.is_floating_point()
            or logits_to_keep.is_complex()
            or (logits_to_keep.dtype == torch.bool)
        ):
            raise TypeError(
                "`logits_to_keep` given as a tensor must be a 1-D integer tensor of sequence positions, got "
                f"{logits_to_keep.dtype} of shape {_shape(logits_to_keep)}"
            )
        return
    if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int):
        raise TypeError(
            "`logits_to_keep` must be an int >= 0 (0 = every position, k = the last k) or a 1-D integer "
            f"tensor of positions, got {type(logits_to_keep).__name__} ({logits_to_keep!r})"
        )
    if logits_to_keep < 0:
        raise ValueError(
            f"`logits_to_keep` must be >= 0 (0 = every position, k = the last k), got {logits_to_keep}"
        )


def check_generation_attention_mask(attention_mask, inputs: torch.Tensor, cache: Cache | None) -> None:
    """`generate`'s 2-D `attention_mask`: one row per prompt and one column per token of the prompt
    (`inputs`: ids or embeddings), or of the cache and the prompt. transformers derives `position_ids` from
    it and then drops an all-ones mask, so a wrong length would otherwise surface as a `position_ids` shape
    error or not at all."""
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.ndim != 2:
        return
    batch, length = inputs.shape[:2]
    past = cache.get_seq_length() if cache is not None else 0
    lengths = sorted({length, past + length})
    if attention_mask.shape[0] != batch or attention_mask.shape[1] not in lengths:
        columns = " or ".join(str(n) for n in lengths)
        raise ValueError(
            f"`attention_mask` must have shape (batch, prompt length) = ({batch}, {columns}) like the "
            f"prompt, got {_shape(attention_mask)}"
        )
