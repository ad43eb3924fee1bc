"""Hyper-connection streams (mHC, arXiv 2512.24880) with exactly doubly-stochastic mixing (docs/ddl_mhc.md,
'Hyper-connections').

The residual state is X in R^{n x d} per token, shape (batch, seq, n, hidden). Around every sublayer F:

    c      = flatten(X) / rms(flatten X)                          (mHC: the maps read the whole state)
    t      = b + alpha * (c W^T)                                  static bias + gated dynamic term, per map
    H_pre  = softmax(t_pre)                                       read weights in R^n (convex; n = 1 -> 1)
    x_in   = H_pre X                                              (n -> 1 read; DDL's CC compressor)
    H_res  = (1 - a) I + a birkhoff(t_res),  a = sigmoid(learned) (exactly doubly stochastic, float32)
             or, with hc_res_mix="lazy", (1 - lam - mu) I + lam birkhoff(t_res) + mu J/n       (`lazy_mix`)
    h      = F(RMSNorm(x_in))
    X'     = H_res X + s u^T                                      (mix, then one rank-1 write)
       "add"   (mHC):  s = H_post = 2 sigmoid(t_post),  u = h
       "delta" (DDL):  s = beta (v - H_res X k),  u = k,  beta = 2 sigmoid(t_beta)        (`delta.py`)

All dynamic logits come from one `maps_proj` GEMM (mHC fuses its three maps the same way); the RMSNorm
gain of c is folded into `maps_proj`, so c is never materialised: c W^T = (x W^T) / rms(x). With
`hc_dynamic=False` only the biases exist and one set of maps serves all tokens. With n = 1 there is no
H_pre/H_res (both are 1), and with n = 1 and "add" no map at all: x' = x + F(RMSNorm(x)), Llama's block.
"""

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import Cache, LinearAttentionCacheLayerMixin

from geoformers.configuration.ddl_mhc import DDLmHCConfig
from geoformers.modeling.delta import DeltaWrite, delta_amplitudes, upcast
from geoformers.modeling.fused_streams import AddMixWrite, DeltaMixWrite, StreamMapsRead, StreamRead, run_node
from geoformers.modeling.ops.charts import birkhoff, num_logits
from geoformers.modeling.ops.dispatch import kernels

LAZY_UNIFORM_INIT = 1e-4  # mu at initialisation of the lazy-minorized mix


def lazy_mix_logits(mix: float) -> torch.Tensor:
    """The three logits of `lazy_mix` at initialisation: softmax = ((1 - a)(1 - mu0), a (1 - mu0), mu0) with
    a = `mix` (hc_res_mix_init) and mu0 = LAZY_UNIFORM_INIT, i.e. (1 - mu0) ((1 - a) I + a X) + mu0 J/n."""
    keep = 1.0 - LAZY_UNIFORM_INIT
    return torch.tensor([math.log((1.0 - mix) * keep), math.log(mix * keep), math.log(LAZY_UNIFORM_INIT)])


def lazy_mix(chart: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Lazy-minorized mix (docs/chart_variants.md): H = (1 - lam - mu) I + lam X + mu J/n with
    (1 - lam - mu, lam, mu) = softmax(logits), so lam, mu >= 0 and lam + mu <= 1 hold exactly. Formed in
    float64 and rounded once: a float32 H misses doubly-stochastic by at most the chart's error plus one
    rounding."""
    weights = torch.softmax(logits.double(), -1)
    n = chart.shape[-1]
    identity = torch.eye(n, device=chart.device, dtype=torch.float64)
    mixed = weights[0] * identity + weights[1] * chart.double() + weights[2] / n
    return mixed.to(chart.dtype)


class StreamMaps(NamedTuple):
    """Per-token maps of one sublayer, computed by `HyperConnection.read` and used by its write."""

    h_res: torch.Tensor | None  # (..., n, n), or (n, n) when static; None when n == 1 (H_res = 1)
    write_logit: torch.Tensor | None  # t_post (..., n) for "add" with n > 1, t_beta (..., 1) for "delta"


class StreamMixing(NamedTuple):
    """What one sublayer's update did, returned with `output_mixing=True`: the per-token linear part of X ->
    X' is X -> H_res X (I - beta k k^T) (docs/ddl_mhc.md, 'The Deep Delta rule'); beta and direction are None
    for "add"."""

    h_res: torch.Tensor | None
    beta: torch.Tensor | None
    direction: torch.Tensor | None


def mix_and_write(
    h_res: torch.Tensor | None, streams: torch.Tensor, amplitudes: torch.Tensor, direction: torch.Tensor
) -> torch.Tensor:
    """X' = H_res X + s u^T (docs/ddl_mhc.md) in the streams' dtype, plain autograd (the reference of
    `fused_streams.AddMixWrite`). H_res: (..., n, n) per token, (n, n) static or None (identity);
    X (..., n, d); amplitudes s (..., n); direction u (..., d)."""
    dtype = streams.dtype
    mixed = streams if h_res is None else torch.matmul(h_res.to(dtype), streams)
    return mixed + amplitudes.to(dtype).unsqueeze(-1) * direction.to(dtype).unsqueeze(-2)


def read_streams(weights: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
    """x_in = H_pre X: weights (n,) static or (..., n) per token, X (..., n, d) -> (..., d), plain autograd
    (the reference of `fused_streams.StreamRead`)."""
    weights = weights.to(streams.dtype)
    if weights.ndim == 1:
        return torch.einsum("n,...nd->...d", weights, streams)
    return (weights.unsqueeze(-1) * streams).sum(-2)


class HyperConnection(nn.Module):
    """Read, mix and write maps of one sublayer (docs/ddl_mhc.md, 'Hyper-connections'). Parameters: static
    logits `pre_bias`, `res_bias`, `write_bias` (H_post for "add", beta for "delta"), the chart weight
    `res_mix_logit` (or the three logits `res_mix_logits` of `lazy_mix` with hc_res_mix="lazy"), and, with
    `hc_dynamic`, the fused projection `maps_proj` (a PEFT-targetable `nn.Linear`) with one gate per map
    (`pre_gate`, `res_gate`, `write_gate`). The delta value projection is `delta.value_proj`."""

    def __init__(self, config: DDLmHCConfig):
        super().__init__()
        n, d = config.hc_streams, config.hidden_size
        self.num_streams = n
        self.chart = config.hc_chart
        self.fused = config.hc_implementation == "fused"
        self.eps = config.rms_norm_eps
        mixes = n > 1
        write_size = 1 if config.residual == "delta" else (n if mixes else 0)
        self.map_sizes = (n if mixes else 0, num_logits(config.hc_chart, n) if mixes else 0, write_size)
        dynamic = config.hc_dynamic and sum(self.map_sizes) > 0

        self.pre_bias = nn.Parameter(torch.zeros(n)) if mixes else None
        self.res_bias = nn.Parameter(torch.zeros(self.map_sizes[1])) if mixes else None
        lazy = config.hc_res_mix == "lazy"
        self.res_mix_logit = nn.Parameter(torch.zeros(())) if mixes and not lazy else None
        self.res_mix_logits = nn.Parameter(torch.zeros(3)) if mixes and lazy else None
        self.write_bias = nn.Parameter(torch.zeros(write_size)) if write_size else None
        self.maps_proj = nn.Linear(n * d, sum(self.map_sizes), bias=False) if dynamic else None
        self.pre_gate = nn.Parameter(torch.zeros(())) if dynamic and mixes else None
        self.res_gate = nn.Parameter(torch.zeros(())) if dynamic and mixes else None
        self.write_gate = nn.Parameter(torch.zeros(())) if dynamic and write_size else None
        self.delta = DeltaWrite(d, n, config.delta_eps) if config.residual == "delta" else None

    def _map_logits(self, streams: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """(t_pre, t_res, t_write), float32: bias + gate * (x W^T) / rms(x), or the bias alone when static."""
        if self.maps_proj is None:
            return self._gated(None)
        flat = streams.flatten(-2)
        mean_square = torch.linalg.vecdot(upcast(flat), upcast(flat)).unsqueeze(-1) / flat.shape[-1]
        inverse_rms = torch.rsqrt(mean_square + self.eps)
        return self._gated(upcast(self.maps_proj(flat)) * inverse_rms)

    def _gated(self, terms: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        """bias + gate * term per map from the dynamic terms (..., sum(map_sizes)), or the biases alone."""
        biases = (self.pre_bias, self.res_bias, self.write_bias)
        if terms is None:
            return tuple(None if bias is None else upcast(bias) for bias in biases)
        gates = (self.pre_gate, self.res_gate, self.write_gate)
        return tuple(
            None if bias is None else upcast(bias) + upcast(gate) * term
            for bias, gate, term in zip(biases, gates, terms.split(self.map_sizes, -1), strict=True)
        )

    def read(self, streams: torch.Tensor) -> tuple[torch.Tensor, StreamMaps]:
        """x_in = H_pre X (..., d) and this sublayer's maps, from streams X (..., n, d)."""
        if self.num_streams == 1:
            _, _, write_logit = self._map_logits(streams)
            return streams.squeeze(-2), StreamMaps(None, write_logit)
        # PEFT wraps maps_proj in a module of its own: then the maps take the reference path through it.
        if self.fused and type(self.maps_proj) is nn.Linear:
            terms, hidden = run_node(
                StreamMapsRead,
                streams, self.maps_proj.weight, self.pre_bias, self.pre_gate, self.eps
            )
            _, res_logit, write_logit = self._gated(terms)
        else:
            pre_logit, res_logit, write_logit = self._map_logits(streams)
            weights = torch.softmax(pre_logit, -1)
            triton = kernels("geoformers.modeling.triton_streams", weights, streams) if self.fused else None
            if triton is not None:
                hidden = triton.triton_read_streams(weights, streams)
            elif self.fused:
                hidden = run_node(StreamRead, weights.expand(*streams.shape[:-2], -1), streams)
            else:
                hidden = read_streams(weights, streams)
        if self.maps_proj is None:
            return hidden, StreamMaps(self._static_h_res(res_logit), write_logit)
        return hidden, StreamMaps(self._h_res(res_logit), write_logit)

    def _h_res(self, res_logit: torch.Tensor) -> torch.Tensor:
        """H_res = (1 - a) I + a chart(t_res), a = sigmoid(res_mix_logit), or `lazy_mix`."""
        chart = birkhoff(res_logit, self.num_streams, self.chart)
        if self.res_mix_logits is not None:
            return lazy_mix(chart, self.res_mix_logits)
        mix = torch.sigmoid(upcast(self.res_mix_logit))
        h_res = mix * chart
        h_res.diagonal(dim1=-2, dim2=-1).add_(1.0 - mix)  # + (1 - a) I, without an identity matrix
        return h_res

    def _static_h_res(self, res_logit: torch.Tensor) -> torch.Tensor:
        """The static H_res (`hc_dynamic=False`) does not depend on the token: without autograd (decoding,
        evaluation) it is computed once and reused until its parameters change (their in-place version
        counters and storages are the key), instead of once per forward."""
        if torch.is_grad_enabled() or torch.compiler.is_compiling():
            return self._h_res(res_logit)
        parameters = (self.res_bias, self.res_mix_logit, self.res_mix_logits)
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in parameters if p is not None)
        if getattr(self, "_static_cache", (None, None))[0] != key:
            self._static_cache = (key, self._h_res(res_logit))
        return self._static_cache[1]

    def forward(
        self, streams: torch.Tensor, sublayer_output: torch.Tensor, maps: StreamMaps
    ) -> tuple[torch.Tensor, StreamMixing]:
        """X' = H_res X + s u^T from X (..., n, d), h (..., d) and the maps of `read`."""
        h_res = maps.h_res
        batch = streams.shape[:-2]
        # CUDA tensors (eager) take the Triton kernels of the same nodes (`triton_streams.py`).
        triton = kernels("geoformers.modeling.triton_streams", streams) if self.fused else None
        if self.fused and h_res is not None:  # a static H_res enters the fused nodes expanded per token
            h_res = h_res.expand(*batch, -1, -1)
        if self.delta is not None:
            direction, beta, value = self.delta(sublayer_output, maps.write_logit)
            if triton is not None and streams.dtype != torch.float64:
                updated = triton.triton_delta_write(h_res, streams, direction, beta, value)
            elif self.fused:
                updated, _ = run_node(DeltaMixWrite, h_res, streams, direction, beta, value)
            else:
                amplitudes = delta_amplitudes(h_res, streams, direction, beta, value)
                updated = mix_and_write(h_res, streams, amplitudes, direction)
            return updated, StreamMixing(maps.h_res, beta, direction)
        if self.write_bias is None:
            return streams + sublayer_output.unsqueeze(-2), StreamMixing(None, None, None)
        amplitudes = 2.0 * torch.sigmoid(maps.write_logit)
        if triton is not None and streams.dtype != torch.float64:
            updated = triton.triton_mix_and_write(h_res, streams, amplitudes, sublayer_output)
        elif self.fused:
            updated = run_node(AddMixWrite, h_res, streams, amplitudes.expand(*batch, -1), sublayer_output)
        else:
            updated = mix_and_write(h_res, streams, amplitudes, sublayer_output)
        return updated, StreamMixing(maps.h_res, None, None)


class StreamExpansion(nn.Module):
    """Embedding (batch, seq, d) -> streams (batch, seq, n, d) (docs/ddl_mhc.md, 'Hyper-connections'):
    "repeat" copies it n times; "conv" is DDL's EC, a causal depthwise convolution over the sequence with n
    outputs per channel, identity-initialised (every stream equals the embedding at init). Its state, the last
    kernel-1 embeddings, lives on layer 0 of the cache (a "hybrid" cache layer), never on the module."""

    def __init__(self, config: DDLmHCConfig):
        super().__init__()
        self.num_streams = config.hc_streams
        self.kernel_size = config.stream_conv_kernel
        # Depthwise Conv1d weight (d * n, 1, kernel): output channel c * n + j is stream j of channel c.
        if config.stream_expansion == "conv":
            channels = config.hidden_size * self.num_streams
            self.weight = nn.Parameter(torch.zeros(channels, 1, self.kernel_size))
        else:
            self.weight = None

    def forward(
        self, embeds: torch.Tensor, cache: Cache | None = None, padding_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        batch, length, d = embeds.shape
        if self.weight is None:
            return embeds.unsqueeze(-2).expand(batch, length, self.num_streams, d)
        inputs = embeds.transpose(1, 2)
        if padding_mask is not None:
            inputs = inputs * padding_mask[:, None, -length:].to(inputs.dtype)
        past = self.kernel_size - 1
        if cache is not None and past > 0:
            if not cache.layers or not isinstance(cache.layers[0], LinearAttentionCacheLayerMixin):
                raise ValueError(
                    "`cache` must be built with `DynamicCache(config=model.config)` for "
                    "stream_expansion='conv': its layer 0 holds the causal convolution state"
                )
            inputs = cache.update_conv_state(inputs, layer_idx=0, conv_kernel_size=past)
        left_pad = past - (inputs.shape[-1] - length)
        expanded = F.conv1d(F.pad(inputs, (left_pad, 0)), self.weight, groups=d)
        return expanded.view(batch, d, self.num_streams, length).permute(0, 3, 2, 1)


class StreamReadout(nn.Module):
    """Streams -> one hidden state before the final norm: softmax(`logits`)-weighted sum over the n
    streams, a learned static read that starts as the mean (docs/ddl_mhc.md, 'Hyper-connections')."""

    def __init__(self, num_streams: int):
        super().__init__()
        self.logits = nn.Parameter(torch.zeros(num_streams))

    def forward(self, streams: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(upcast(self.logits), -1).to(streams.dtype)
        return (weights.unsqueeze(-1) * streams).sum(-2)
