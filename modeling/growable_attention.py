"""Growable attention (INCRT): a layer's self-attention over a list of heads that grows and shrinks, each
head with its own prototype bank (DDCL), and the layer's `IncrtGate` (`incrt.py`) deciding when.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from geoformers.modeling.incrt import GateDecision, IncrtGate, directional_matrix, head_directional_energy
from geoformers.modeling.prototypes import (
    PrototypeBank,
    PrototypeOutput,
    prototype_block,
    temperature_from_rho,
)


class AttentionHead(nn.Module):
    """One head: q/k/v projections (hidden -> head_dim), its own prototype bank, o_proj (head_dim -> hidden).

    Its contribution to the layer is o_proj(prototype_block(softmax(q k^T / sqrt(D) + mask) v)).
    """

    def __init__(self, config):
        super().__init__()
        self.q_proj = nn.Linear(config.hidden_size, config.head_dim)
        self.k_proj = nn.Linear(config.hidden_size, config.head_dim)
        self.v_proj = nn.Linear(config.hidden_size, config.head_dim)
        self.prototype_bank = PrototypeBank(
            config.num_prototypes, config.head_dim, config.tau_min, config.tau_init
        )
        self.o_proj = nn.Linear(config.head_dim, config.hidden_size, bias=False)

    @torch.no_grad()
    def align_with(self, direction: torch.Tensor) -> None:
        """Make the head attend along the unit vector u: first query and key rows = D^(1/4) u (biases 0),
        so that row's logit q_0 k_0 / sqrt(D) is exactly (u.x_i)(u.x_j)."""
        scale = self.q_proj.out_features ** 0.25
        for projection in (self.q_proj, self.k_proj):
            projection.weight[0] = scale * direction.to(projection.weight.dtype)
            projection.bias[0] = 0.0


class AttentionOutput(NamedTuple):
    output: torch.Tensor  # sum_h W_O^h o_hat^h, (B, T, hidden)
    attention_probs: torch.Tensor | None  # (B, H, T, T) when requested
    prototypes: PrototypeOutput


class GrowableAttention(nn.Module):
    """Self-attention over a list of `AttentionHead`s that grows and shrinks, plus the layer's `IncrtGate`.

    The forward stacks the per-head weights and runs all heads in one batched matmul (torch SDPA; the explicit
    softmax when attention probabilities are requested).
    """

    def __init__(self, config, layer_index: int):
        super().__init__()
        self.config = config
        self.layer_index = layer_index
        self.heads = nn.ModuleList([AttentionHead(config) for _ in range(config.num_heads[layer_index])])
        self.gate = IncrtGate(config, layer_index)

    def stacked(self, projection: str) -> torch.Tensor:
        """(H, D, hidden) weights of the heads' q_proj or k_proj (the gate's W_Q^h, W_K^h transposed)."""
        return torch.stack([getattr(head, projection).weight for head in self.heads])

    def temperatures(self) -> torch.Tensor:
        """Per-head tau = tau_min + softplus(rho), (H,)."""
        return temperature_from_rho(torch.cat([head.prototype_bank.rho for head in self.heads]),
                                    self.config.tau_min)

    def prototype_banks(self) -> torch.Tensor:
        """(H, K, D) prototypes of all heads."""
        return torch.stack([head.prototype_bank.prototypes for head in self.heads])

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None,
                output_attentions: bool = False) -> AttentionOutput:
        """hidden_states (B, T, hidden); attention_mask: boolean (B, 1, 1, T), True for keys to attend."""
        head_dim = self.config.head_dim
        # Each head's projections are called as modules (not fused from their weights) so that wrappers
        # such as PEFT's LoRA layers take part in the forward pass.
        query, key, value = (
            torch.stack([getattr(head, name)(hidden_states) for head in self.heads], dim=1)
            for name in ("q_proj", "k_proj", "v_proj")
        )
        dropout = self.config.attention_probs_dropout_prob if self.training else 0.0
        attention_probs = None
        if output_attentions:
            scores = query @ key.transpose(-1, -2) / math.sqrt(head_dim)
            if attention_mask is not None:
                scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
            attention_probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
            head_outputs = F.dropout(attention_probs, dropout, self.training) @ value
        else:
            head_outputs = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                          dropout_p=dropout)
        prototypes = prototype_block(head_outputs, self.prototype_banks(), self.temperatures())
        output = sum(head.o_proj(prototypes.output[:, index]) for index, head in enumerate(self.heads))
        return AttentionOutput(output, attention_probs, prototypes)

    @torch.no_grad()
    def gate_check(self, second_moment: torch.Tensor) -> GateDecision:
        """Run this layer's gate on C = X^T X / N of its input."""
        query_weights, key_weights = self.stacked("q_proj").float(), self.stacked("k_proj").float()
        second_moment = second_moment.float()
        return self.gate.check(second_moment, directional_matrix(query_weights, key_weights),
                               head_directional_energy(second_moment, query_weights, key_weights))

    def add_head(self, head: AttentionHead, direction: torch.Tensor | None) -> int:
        """Append a ready-initialised head; returns its index."""
        self.heads.append(head)
        self.gate.record_growth(len(self.heads) - 1, direction)
        return len(self.heads) - 1

    def remove_head(self, index: int) -> AttentionHead:
        """Remove head `index` (the caller keeps at least one); returns the removed module."""
        head = self.heads[index]
        del self.heads[index]
        self.gate.record_pruning(index)
        return head
