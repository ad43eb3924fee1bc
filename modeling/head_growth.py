"""The growth API of a DDCL-INCRT model (INCRT): grow, prune and resize the heads of its layers'
`GrowableAttention`, and run the layers' gates. `config.num_heads` follows every change.

`IncrtGrowthCallback` (training/growth.py) drives it inside a `Trainer`; it can also be called by hand.
"""

from __future__ import annotations

import torch

from geoformers.modeling.growable_attention import AttentionHead, GrowableAttention
from geoformers.modeling.incrt import GateDecision


class HeadGrowthMixin:
    """Growth API of `DDCLIncrtPreTrainedModel` (module docstring); needs `base_model.layers` whose
    `attention` is a `GrowableAttention`, and the model's `_init_weights` for new heads."""

    def _attention(self, layer: int) -> GrowableAttention:
        num_layers = len(self.base_model.layers)
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < num_layers:
            raise ValueError(f"`layer` must be an int in [0, {num_layers}), got {layer!r}")
        return self.base_model.layers[layer].attention

    def _record_head_count(self, layer: int) -> None:
        num_heads = list(self.config.num_heads)
        num_heads[layer] = len(self._attention(layer).heads)
        self.config.num_heads = num_heads

    @torch.no_grad()
    def grow_head(self, layer: int, direction: torch.Tensor | None = None) -> AttentionHead:
        """Append a head to `layer` and return it (INCRT growth). Function-preserving: its o_proj starts
        at zero, so the logits do not change, while o_proj's gradient is non-zero. With `direction` (a
        vector in R^hidden, normalised here) the head's first query/key rows point along it and the
        direction joins the layer gate's deflation basis."""
        attention = self._attention(layer)
        if len(attention.heads) >= self.config.max_heads:
            raise ValueError(f"layer {layer} already has `max_heads` = {self.config.max_heads} heads")
        unit = None
        if direction is not None:
            if not isinstance(direction, torch.Tensor) or direction.shape != (self.config.hidden_size,):
                raise ValueError(f"`direction` must be a tensor of shape ({self.config.hidden_size},), got "
                                 f"{getattr(direction, 'shape', type(direction).__name__)}")
            norm = direction.double().norm()
            if not torch.isfinite(norm) or norm < 1e-8:
                raise ValueError("`direction` must be finite and non-zero")
            unit = (direction.double() / norm).float().to(attention.gate.basis.device)
        reference = attention.heads[0].o_proj.weight
        head = AttentionHead(self.config).to(device=reference.device, dtype=reference.dtype)
        head.apply(self._init_weights)
        head.o_proj.weight.zero_()
        if unit is not None:
            head.align_with(unit)
        attention.add_head(head, unit)
        self._record_head_count(layer)
        return head

    @torch.no_grad()
    def prune_head(self, layer: int, head: int) -> AttentionHead:
        """Remove head `head` of `layer` and return it; the output loses exactly that head's contribution."""
        attention = self._attention(layer)
        num_heads = len(attention.heads)
        if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < num_heads:
            raise ValueError(f"`head` must be an int in [0, {num_heads}) for layer {layer}, got {head!r}")
        if num_heads == 1:
            raise ValueError(f"cannot prune the last remaining head of layer {layer}")
        removed = attention.remove_head(head)
        self._record_head_count(layer)
        return removed

    def resize_heads(self, num_heads: int | list[int]) -> None:
        """Grow (no direction) or prune to the given per-layer counts; pruning removes the last heads first
        (the most recently grown)."""
        num_layers = len(self.base_model.layers)
        max_heads = self.config.max_heads
        targets = num_heads
        if isinstance(num_heads, int) and not isinstance(num_heads, bool):
            targets = [num_heads] * num_layers
        if not isinstance(targets, (list, tuple)) or len(targets) != num_layers:
            raise ValueError(f"`num_heads` must be an int or a list of {num_layers} ints, got {num_heads!r}")
        for layer, target in enumerate(targets):
            if isinstance(target, bool) or not isinstance(target, int) or not 1 <= target <= max_heads:
                raise ValueError(f"`num_heads[{layer}]` must be an int in [1, {max_heads}], got {target!r}")
        for layer, target in enumerate(targets):
            heads = self._attention(layer).heads
            while len(heads) < target:
                self.grow_head(layer)
            while len(heads) > target:
                self.prune_head(layer, len(heads) - 1)

    @torch.no_grad()
    def gate_second_moments(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """C_l = X_l^T X_l / N for every layer's input X_l (eval mode, no dropout), on N = gate_num_tokens
        real tokens evenly spaced over the batch. Several processes can average these before `gate_check`."""
        was_training = self.training
        self.eval()
        try:
            outputs = self.base_model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                inputs_embeds=inputs_embeds, output_hidden_states=True, return_dict=True,
            )
        finally:
            self.train(was_training)
        first = outputs.hidden_states[0]
        if attention_mask is None:
            token_mask = torch.ones(first.shape[:2], dtype=torch.bool, device=first.device)
        else:
            token_mask = attention_mask.to(first.device) != 0
        positions = token_mask.flatten().nonzero().squeeze(1)
        if positions.shape[0] == 0:
            raise ValueError("a gate check needs at least one real token: the batch is empty or fully padded")
        count = min(self.config.gate_num_tokens, positions.shape[0])
        spaced = torch.linspace(0, positions.shape[0] - 1, count, device=first.device).round().long()
        chosen = positions[spaced]
        moments = []
        for layer_input in outputs.hidden_states[:-1]:
            tokens = layer_input.reshape(-1, layer_input.shape[-1])[chosen].float()
            moments.append(tokens.T @ tokens / count)
        return moments

    @torch.no_grad()
    def gate_check(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        second_moments: list[torch.Tensor] | None = None,
    ) -> list[GateDecision]:
        """One INCRT gate check per layer, on a batch or on precomputed `second_moments` (one d x d matrix
        per layer, e.g. averaged over processes). Updates the gate buffers and applies nothing: act on the
        decisions with `grow_head(layer, decision.direction)` and `prune_head`. An empty batch or non-finite
        matrices raise ValueError and leave every layer's gate as it was."""
        if second_moments is None:
            second_moments = self.gate_second_moments(
                input_ids, attention_mask, token_type_ids, inputs_embeds
            )
        layers = self.base_model.layers
        hidden = self.config.hidden_size
        if len(second_moments) != len(layers) or any(
            not isinstance(m, torch.Tensor) or m.shape != (hidden, hidden) for m in second_moments
        ):
            raise ValueError(
                f"`second_moments` must hold {len(layers)} matrices of shape ({hidden}, {hidden})"
            )
        if not all(bool(torch.isfinite(m).all()) for m in second_moments):
            raise ValueError("`second_moments` must be finite (non-finite ones would corrupt the gate state)")
        gates = [layer.attention.gate for layer in layers]
        saved = [{name: buffer.clone() for name, buffer in gate.named_buffers()} for gate in gates]
        try:
            return [layer.attention.gate_check(moment)
                    for layer, moment in zip(layers, second_moments, strict=True)]
        except ValueError:  # a later layer's check failed: no layer keeps a half-done check
            for gate, state in zip(gates, saved, strict=True):
                for name, buffer in gate.named_buffers():  # non-persistent ones too (`IncrtGate`)
                    buffer.copy_(state[name])
            raise
