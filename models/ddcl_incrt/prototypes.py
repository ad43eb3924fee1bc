"""DDCL prototype block (docs/ddcl_incrt.md, 'Prototype FFN'): soft assignment of each head output to that
head's prototype bank.

For a head output o and prototypes p_1..p_K with temperature tau = tau_min + softplus(rho):

    q_k   = softmax_k(-||o - p_k||^2 / tau)
    o_hat = sum_k q_k p_k
    L_q   = sum_k q_k ||o - p_k||^2 = ||o - o_hat||^2 + sum_k q_k ||p_k - o_hat||^2 = L_OLS + V

The identity is exact because sum_k q_k (o_hat - p_k) = 0. Everything is computed in float32 (float64 for
float64 inputs), also under autocast: squared distances cancel catastrophically in half precision.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from geoformers.models.one_element_parameters import reshape_scalars_on_load


class PrototypeOutput(NamedTuple):
    """Per-token results of the prototype block; `H` heads, `T` tokens, `K` prototypes, `D` head width."""

    output: torch.Tensor  # o_hat, (B, H, T, D), in the dtype of the input
    assignments: torch.Tensor  # q, (B, H, T, K), float32 (float64 for float64 inputs), as the terms below
    l_ols: torch.Tensor  # ||o - o_hat||^2, (B, H, T)
    variance: torch.Tensor  # V = sum_k q_k ||p_k - o_hat||^2, (B, H, T)
    l_q: torch.Tensor  # sum_k q_k ||o - p_k||^2, (B, H, T)


def temperature_from_rho(rho: torch.Tensor, tau_min: float) -> torch.Tensor:
    """tau = tau_min + softplus(rho) (DDCL temperature, bounded below by tau_min > 0)."""
    return tau_min + F.softplus(rho)


def rho_for_temperature(tau: float, tau_min: float) -> float:
    """Inverse of `temperature_from_rho`: the rho giving temperature tau (requires tau > tau_min).

    softplus^-1(y) = log(expm1(y)) = y + log(-expm1(-y)); the second form does not overflow for large y.
    """
    if not tau > tau_min:
        raise ValueError(f"`tau` ({tau}) must exceed `tau_min` ({tau_min})")
    excess = tau - tau_min
    return excess + math.log(-math.expm1(-excess))


def squared_distances(points: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
    """||x - p_k||^2 for points (B, H, T, D) and per-head prototypes (H, K, D) -> (B, H, T, K).

    ||x||^2 + ||p||^2 - 2 x.p for all prototypes (one matmul), then the nearest prototype's entry is
    recomputed from the difference x - p_k*: it dominates L_q and V once assignments are sharp, and the
    expanded form would leave it a rounding error of about 1e-7 * ||p||^2, larger than the distance itself.
    """
    cross = torch.einsum("bhtd,hkd->bhtk", points, prototypes)
    point_norms = points.pow(2).sum(-1, keepdim=True)
    prototype_norms = prototypes.pow(2).sum(-1)[None, :, None, :]
    distances = (point_norms + prototype_norms - 2.0 * cross).clamp_min(0.0)
    nearest = distances.argmin(dim=-1, keepdim=True)
    bank = prototypes[None].expand(points.shape[0], -1, -1, -1)
    nearest_prototypes = torch.gather(bank, 2, nearest.expand(-1, -1, -1, points.shape[-1]))
    exact = (points - nearest_prototypes).pow(2).sum(-1, keepdim=True)
    return distances.scatter(-1, nearest, exact)


def prototype_block(
    head_outputs: torch.Tensor, prototypes: torch.Tensor, tau: torch.Tensor
) -> PrototypeOutput:
    """DDCL prototype block for all heads of a layer at once (docs/ddcl_incrt.md, 'Prototype FFN':
    L_q = L_OLS + V).

    head_outputs: (B, H, T, D); prototypes: (H, K, D), one bank per head; tau: (H,), one temperature per head.
    """
    if head_outputs.dim() != 4:
        raise ValueError(
            f"`head_outputs` must have shape (batch, heads, tokens, dim), got {tuple(head_outputs.shape)}"
        )
    num_heads, dim = head_outputs.shape[1], head_outputs.shape[3]
    if prototypes.dim() != 3 or prototypes.shape[0] != num_heads or prototypes.shape[2] != dim:
        raise ValueError(
            f"`prototypes` must have shape (heads={num_heads}, K, dim={dim}), got {tuple(prototypes.shape)}"
        )
    if tau.shape != (prototypes.shape[0],):
        raise ValueError(
            f"`tau` must have shape ({prototypes.shape[0]},), one temperature per head, "
            f"got {tuple(tau.shape)}"
        )
    compute_dtype = torch.promote_types(head_outputs.dtype, torch.float32)
    device = head_outputs.device.type  # devices without autocast (meta: shape-only runs) have none to leave
    no_autocast = torch.autocast(device, enabled=False) if torch.amp.is_autocast_available(device) else None
    with no_autocast or nullcontext():
        points = head_outputs.to(compute_dtype)
        bank = prototypes.to(compute_dtype)
        distances = squared_distances(points, bank)
        assignments = torch.softmax(-distances / tau.to(compute_dtype)[None, :, None, None], dim=-1)
        reconstruction = torch.einsum("bhtk,hkd->bhtd", assignments, bank)
        l_q = (assignments * distances).sum(-1)
        l_ols = (points - reconstruction).pow(2).sum(-1)
        variance = (assignments * squared_distances(reconstruction, bank)).sum(-1)
    return PrototypeOutput(reconstruction.to(head_outputs.dtype), assignments, l_ols, variance, l_q)


def min_pairwise_distance(prototypes: torch.Tensor) -> torch.Tensor:
    """min_{i != j} ||p_i - p_j|| per head for prototypes (H, K, D) -> (H,) (separation without collapse)."""
    differences = prototypes[:, :, None, :] - prototypes[:, None, :, :]
    distances = differences.pow(2).sum(-1).sqrt()
    diagonal = torch.eye(prototypes.shape[1], dtype=torch.bool, device=prototypes.device)
    return distances.masked_fill(diagonal, math.inf).flatten(1).amin(dim=-1)  # no boolean indexing: no sync


def assignment_perplexity(
    assignments: torch.Tensor, token_mask: torch.Tensor, eps: float = 1e-12
) -> torch.Tensor:
    """Effective number of used prototypes per head: exp(entropy of the mean assignment over real tokens).

    assignments: (B, H, T, K); token_mask: (B, T), 1 for real tokens -> (H,), in [1, K].
    """
    weights = token_mask.to(assignments.dtype)[:, None, :, None]
    usage = (assignments * weights).sum(dim=(0, 2)) / weights.sum(dim=(0, 2)).clamp_min(eps)
    entropy = -(usage * usage.clamp_min(eps).log()).sum(-1)
    return entropy.exp()


class PrototypeBank(nn.Module):
    """One head's prototypes (K x D) and its learnable temperature tau = tau_min + softplus(rho).

    `prototypes` start at zero and `rho` (a 1-element vector: FSDP2 shards no 0-d parameter) at the value
    giving tau_init; the model's `_init_weights` draws the prototypes (DDCLIncrtPreTrainedModel). Checkpoints
    saved with a 0-d `rho` still load (`one_element_parameters`: `from_pretrained` through the converter the
    model registers, `load_state_dict` through the hook below).
    """

    def __init__(self, num_prototypes: int, dim: int, tau_min: float, tau_init: float):
        super().__init__()
        self.tau_min = tau_min
        self.tau_init = tau_init
        self.prototypes = nn.Parameter(torch.zeros(num_prototypes, dim))
        self.rho = nn.Parameter(torch.tensor([rho_for_temperature(tau_init, tau_min)]))
        reshape_scalars_on_load(self, ("rho",))

    def temperature(self) -> torch.Tensor:
        """tau = tau_min + softplus(rho), shape (1,)."""
        return temperature_from_rho(self.rho, self.tau_min)

    def extra_repr(self) -> str:
        num_prototypes, dim = self.prototypes.shape
        return f"num_prototypes={num_prototypes}, dim={dim}, tau_min={self.tau_min}"
