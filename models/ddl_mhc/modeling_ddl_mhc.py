"""DDL-mHC causal LM (docs/ddl_mhc.md): a Llama decoder whose residual stream is n hyper-connection streams,
mixed by an exactly doubly-stochastic H_res and updated by the Deep Delta rule

    X' = H_res X (I - beta k k^T) + beta v k^T   (delta)    or    X' = H_res X + H_post^T h   (add, mHC)

around both sublayers of every layer. Norm, rotary embedding, MLP and attention are transformers' Llama
modules (the attention goes through `ALL_ATTENTION_FUNCTIONS`: eager, sdpa, ...). The stream modules below
(`HyperConnection`, `DeltaWrite`, `StreamExpansion`, `StreamReadout`) hold the parameters and call the ops
by name: `read_streams` (`ops/stream_read/`), `birkhoff` (the chart), `write_streams` (`ops/stream_write/`);
one rule chooses each op's Triton kernel or autograd node from the tensors alone (`ops/dispatch.py`), and for
a few decoded tokens on a CPU the whole hyper-connection's host path (`ops/host_connection.py`).
`hc_streams=1, residual="add"` is exactly
`LlamaForCausalLM` (same module names, so `llama_conversion.py` is a state-dict copy).

Hyper-connections (mHC, arXiv 2512.24880; docs/ddl_mhc.md, 'Hyper-connections'). The residual state is
X in R^{n x d} per token, shape (batch, seq, n, hidden). Around every sublayer F:

    c      = flatten(X) / rms(flatten X)                          (mHC: the maps read the whole state)
    t      = b + alpha * (c W^T)                                  static bias + gated dynamic term, per map
    H_pre  = softmax(t_pre)                                       read weights in R^n (convex; n = 1 -> 1)
    x_in   = H_pre X                                              (n -> 1 read; DDL's CC compressor)
    H_res  = (1 - a) I + a birkhoff(t_res),  a = sigmoid(learned) (exactly doubly stochastic, float32)
             or, with hc_res_mix="lazy", (1 - lam - mu) I + lam birkhoff(t_res) + mu J/n       (`lazy_mix`)
    h      = F(RMSNorm(x_in))
    X'     = H_res X + s u^T                                      (mix, then one rank-1 write)
       "add"   (mHC):  s = H_post = 2 sigmoid(t_post),  u = h
       "delta" (DDL, arXiv 2601.00417):  s = beta (v - H_res X k),  u = k = h / sqrt(||h||^2 + eps^2),
                       beta = 2 sigmoid(t_beta),  v = W_v h + b_v                          (`DeltaWrite`)

All dynamic logits come from one `maps_proj` GEMM (mHC fuses its three maps the same way); the RMSNorm
gain of c is folded into `maps_proj`, so c is never materialised: c W^T = (x W^T) / rms(x). With
`hc_dynamic=False` only the biases exist and one set of maps serves all tokens. With n = 1 there is no
H_pre/H_res (both are 1), and with n = 1 and "add" no map at all: x' = x + F(RMSNorm(x)), Llama's block;
with n = 1 and "delta" it is DDL with d_v = 1: x' = x + beta (v - k . x) k (DDL eq. 3.7).
"""

# first: a transformers outside the supported range fails here, naming both (docs/versions.md)
from geoformers.models.transformers_range import TRANSFORMERS_REQUIREMENT  # noqa: F401

# isort: split

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.module import _global_forward_hooks
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache, LinearAttentionCacheLayerMixin
from transformers.masking_utils import create_causal_mask, create_recurrent_attention_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import slice_logits_to_keep
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from geoformers.models.ddl_mhc.causal_lm_loss import causal_lm_loss
from geoformers.models.ddl_mhc.configuration_ddl_mhc import DDLmHCConfig
from geoformers.models.ddl_mhc.ops.charts import birkhoff, num_logits
from geoformers.models.ddl_mhc.ops.dispatch import choose_path
from geoformers.models.ddl_mhc.ops.host_connection import host_read, host_rows, host_write
from geoformers.models.ddl_mhc.ops.precision import autocast_off
from geoformers.models.ddl_mhc.ops.stream_read import read_streams
from geoformers.models.ddl_mhc.ops.stream_read.naive import map_terms, upcast
from geoformers.models.ddl_mhc.ops.stream_write import write_streams
from geoformers.models.input_checks import (
    check_attention_mask,
    check_cache,
    check_generation_attention_mask,
    check_inputs_embeds,
    check_labels,
    check_logits_to_keep,
    check_position_ids,
    check_token_ids,
    embeds_bound,
)
from geoformers.models.one_element_parameters import (
    register_one_element_parameters,
    reshape_scalars_on_load,
)

LAZY_UNIFORM_INIT = 1e-4  # mu at initialisation of the lazy-minorized mix
ONE_ELEMENT_PARAMETERS = ("res_mix_logit", "pre_gate", "res_gate", "write_gate")  # stored 0-d before


try:  # in the package: saving, Hub code and strict loading (model_io), which a saved folder does not ship
    if not __name__.startswith("geoformers."):
        raise ImportError(f"{__name__} is a saved folder's copy")
    from geoformers.model_io.io_mixin import PretrainedIOMixin
except ImportError:  # a saved folder's copy, loaded as remote code: transformers' own saving and loading

    class PretrainedIOMixin:
        """Nothing added to transformers' `PreTrainedModel`."""


class DDLmHCRMSNorm(LlamaRMSNorm):
    """Llama's RMSNorm (statistics in float32)."""


class DDLmHCRotaryEmbedding(LlamaRotaryEmbedding):
    """Llama's rotary embedding, driven by `config.rope_parameters` (any transformers RoPE type)."""


class DDLmHCMLP(LlamaMLP):
    """Llama's gated MLP: down_proj(act(gate_proj(x)) * up_proj(x))."""


class DDLmHCAttention(LlamaAttention):
    """Llama's RoPE attention with grouped key/value heads, `DynamicCache` updates and the attention
    backend chosen by `config._attn_implementation` (eager and sdpa agree)."""


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


def unit_direction(output: torch.Tensor, eps: float) -> torch.Tensor:
    """k = h / sqrt(||h||^2 + eps^2) (docs/ddl_mhc.md, 'The Deep Delta rule'), at least float32: unit norm up
    to eps, finite at h = 0."""
    output = upcast(output)
    return output * torch.rsqrt(output.square().sum(-1, keepdim=True) + eps * eps)


def beta_bias_for(beta: float) -> float:
    """t with 2 sigmoid(t) = beta: the logit that starts the gate at `delta_beta_init`."""
    return math.log(beta / (2.0 - beta))


class StreamMaps(NamedTuple):
    """Per-token maps of one sublayer, computed by `HyperConnection.read` and used by its write."""

    h_res: torch.Tensor | None  # (..., n, n), or (n, n) when static; None when n == 1 (H_res = 1)
    write_logit: torch.Tensor | None  # t_post (..., n) for "add" with n > 1, t_beta (..., 1) for "delta"
    res_logit: torch.Tensor | None  # the chart logits t_res (..., m) or (m,); None when n == 1
    host: list | None = None  # the host path's rows (`ops/host_connection.py`): the write follows the read


class StreamMixing(NamedTuple):
    """What one sublayer's update did, returned with `output_mixing=True`: the per-token linear part of X ->
    X' is X -> H_res X (I - beta k k^T) (docs/ddl_mhc.md, 'The Deep Delta rule'); beta and direction are None
    for "add"; `res_logit` is the chart's input t_res of H_res (None when n = 1)."""

    h_res: torch.Tensor | None
    beta: torch.Tensor | None
    direction: torch.Tensor | None
    res_logit: torch.Tensor | None = None


class DeltaWrite(nn.Module):
    """The delta write's per-token quantities of one sublayer: direction k(h), gate beta(t_beta) and value
    `value_proj`(h) (a PEFT-targetable `nn.Linear`); the hyper-connection applies X' = H_res X + s k^T
    through the op `write_streams`."""

    def __init__(self, hidden_size: int, num_streams: int, eps: float):
        super().__init__()
        self.eps = eps
        self.value_proj = nn.Linear(hidden_size, num_streams, bias=True)

    def forward(
        self, sublayer_output: torch.Tensor, beta_logit: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(k, beta, v) from h (..., d) and the gate logit t_beta ((..., 1) or (1,))."""
        direction = unit_direction(sublayer_output, self.eps)
        beta = 2.0 * torch.sigmoid(upcast(beta_logit))
        return direction, beta, self.value_proj(sublayer_output)


class HyperConnection(nn.Module):
    """Read, mix and write maps of one sublayer (docs/ddl_mhc.md, 'Hyper-connections'). Parameters: static
    logits `pre_bias`, `res_bias`, `write_bias` (H_post for "add", beta for "delta"), the chart weight
    `res_mix_logit` (or the three logits `res_mix_logits` of `lazy_mix` with hc_res_mix="lazy"), and, with
    `hc_dynamic`, the fused projection `maps_proj` (a PEFT-targetable `nn.Linear`) with one gate per map
    (`pre_gate`, `res_gate`, `write_gate`). The delta value projection is `delta.value_proj`. The read, chart
    and write are op calls (`read_streams`, `birkhoff`, `write_streams`); the projection runs first, as a
    module, so a PEFT adapter on it acts and the read after it keeps its fast path."""

    def __init__(self, config: DDLmHCConfig):
        super().__init__()
        n, d = config.hc_streams, config.hidden_size
        self.num_streams = n
        self.chart = config.hc_chart
        self.eps = config.rms_norm_eps
        mixes = n > 1
        write_size = 1 if config.residual == "delta" else (n if mixes else 0)
        self.map_sizes = (n if mixes else 0, num_logits(config.hc_chart, n) if mixes else 0, write_size)
        dynamic = config.hc_dynamic and sum(self.map_sizes) > 0

        self.pre_bias = nn.Parameter(torch.zeros(n)) if mixes else None
        self.res_bias = nn.Parameter(torch.zeros(self.map_sizes[1])) if mixes else None
        lazy = config.hc_res_mix == "lazy"
        self.res_mix_logit = nn.Parameter(torch.zeros(1)) if mixes and not lazy else None
        self.res_mix_logits = nn.Parameter(torch.zeros(3)) if mixes and lazy else None
        self.write_bias = nn.Parameter(torch.zeros(write_size)) if write_size else None
        self.maps_proj = nn.Linear(n * d, sum(self.map_sizes), bias=False) if dynamic else None
        self.pre_gate = nn.Parameter(torch.zeros(1)) if dynamic and mixes else None
        self.res_gate = nn.Parameter(torch.zeros(1)) if dynamic and mixes else None
        self.write_gate = nn.Parameter(torch.zeros(1)) if dynamic and write_size else None
        self.delta = DeltaWrite(d, n, config.delta_eps) if config.residual == "delta" else None
        self.host_rows = host_rows(n) if dynamic and mixes else 0  # the host path (ops/host_connection.py)
        reshape_scalars_on_load(self, ONE_ELEMENT_PARAMETERS)

    def _map_logits(self, streams: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """(t_pre, t_res, t_write), float32: bias + gate * (x W^T) / rms(x), or the bias alone when static."""
        if self.maps_proj is None:
            return self._gated(None)
        return self._gated(map_terms(streams, self.maps_proj(streams.flatten(-2)), self.eps))

    def _gated(self, terms: torch.Tensor | None, with_pre: bool = True) -> tuple[torch.Tensor | None, ...]:
        """bias + gate * term per map from the dynamic terms (..., sum(map_sizes)), or the biases alone;
        `with_pre=False` leaves out t_pre (None), which the fused read has already used."""
        biases = (self.pre_bias if with_pre else None, self.res_bias, self.write_bias)
        if terms is None:
            return tuple(None if bias is None else upcast(bias) for bias in biases)
        gates = (self.pre_gate, self.res_gate, self.write_gate)
        return tuple(
            None if bias is None else upcast(bias) + upcast(gate) * term
            for bias, gate, term in zip(biases, gates, terms.split(self.map_sizes, -1), strict=True)
        )

    def _on_host(self, streams: torch.Tensor) -> bool:
        """Whether the one rule sends this sublayer to its host path (decoding a few rows on a CPU)."""
        rows = streams.shape[:-2].numel()
        path = choose_path(streams, self.pre_bias, kernel_dtypes=(), host_rows=self.host_rows, rows=rows)
        return path == "host" and rows > 0

    def observed(self) -> bool:
        """Whether a forward hook sees this module's `StreamMixing` record: one of its own (transformers'
        output capture installs them at the first `output_mixing=True`) or a global one."""
        return bool(self._forward_hooks or _global_forward_hooks)

    def read(self, streams: torch.Tensor, record: bool = True) -> tuple[torch.Tensor, StreamMaps]:
        """x_in = H_pre X (..., d) and this sublayer's maps, from streams X (..., n, d). `record=False` (the
        decoder layer's, when nothing `observed` the record) lets the host path leave out the maps that only
        the `StreamMixing` record reads: H_res, t_write and t_res in StreamMaps, beta and k in the record."""
        if self.host_rows and self._on_host(streams):
            hidden, h_res, write_logit, res_logit, rows = host_read(self, streams, record)
            return hidden, StreamMaps(h_res, write_logit, res_logit, host=rows)
        if self.num_streams == 1:
            _, _, write_logit = self._map_logits(streams)
            return streams.squeeze(-2), StreamMaps(None, write_logit, None)
        if self.maps_proj is None:  # static maps: one H_pre and H_res for all tokens
            _, hidden = read_streams(streams, self.pre_bias)
            _, res_logit, write_logit = self._gated(None, with_pre=False)
            return hidden, StreamMaps(self._static_h_res(res_logit), write_logit, res_logit)
        with autocast_off(streams.device.type):  # the maps GEMM in the streams' dtype, also under autocast
            projected = self.maps_proj(streams.flatten(-2))  # plain or LoRA-wrapped, before the fused read
        terms, hidden = read_streams(streams, self.pre_bias, self.pre_gate, projected, self.eps)
        _, res_logit, write_logit = self._gated(terms, with_pre=False)
        return hidden, StreamMaps(self._h_res(res_logit), write_logit, res_logit)

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
        if maps.host is not None:
            record = maps.h_res is not None  # `read(record=False)` left the maps out
            updated, beta, direction = host_write(self, streams, sublayer_output, maps.host, record)
            return updated, StreamMixing(maps.h_res, beta, direction, maps.res_logit)
        if self.delta is not None:
            direction, beta, value = self.delta(sublayer_output, maps.write_logit)
            updated = write_streams(maps.h_res, streams, direction, beta=beta, value=value)
            return updated, StreamMixing(maps.h_res, beta, direction, maps.res_logit)
        if self.write_bias is None:  # n = 1, "add": Llama's residual x + h
            return streams + sublayer_output.unsqueeze(-2), StreamMixing(None, None, None)
        amplitudes = 2.0 * torch.sigmoid(maps.write_logit)  # H_post
        updated = write_streams(maps.h_res, streams, sublayer_output, amplitudes)
        return updated, StreamMixing(maps.h_res, None, None, maps.res_logit)


@dataclass
class DDLmHCModelOutputWithPast(BaseModelOutputWithPast):
    r"""
    hidden_states: with `output_hidden_states=True`, one (batch, seq, hidden) tensor per layer boundary, as
        every causal LM returns: the read-out of the streams entering each layer, and last the final normed
        hidden state (`last_hidden_state`); with `hc_streams=1` exactly Llama's hidden states.
    stream_states: with `output_stream_states=True`, the stream states X (batch, seq, n, hidden) entering
        every layer and leaving the last one (before the read-out and final norm).
    mixing: with `output_mixing=True`, one `StreamMixing(h_res, beta, direction, res_logit)` per sublayer
        (attention then MLP of each layer): the per-token linear part X -> H_res X (I - beta k k^T) of the
        update and the chart logits of H_res.
    """

    stream_states: tuple[torch.Tensor, ...] | None = None
    mixing: tuple[StreamMixing, ...] | None = None


@dataclass
class DDLmHCCausalLMOutputWithPast(CausalLMOutputWithPast):
    r"""
    stream_states, mixing: see `DDLmHCModelOutputWithPast`.
    """

    stream_states: tuple[torch.Tensor, ...] | None = None
    mixing: tuple[StreamMixing, ...] | None = None


class DDLmHCDecoderLayer(GradientCheckpointingLayer):
    """Pre-norm attention and MLP, each wrapped in a hyper-connection: read x_in = H_pre X, run the
    sublayer on RMSNorm(x_in), write X' = H_res X (I - beta k k^T) + beta v k^T (or the mHC add)."""

    def __init__(self, config: DDLmHCConfig, layer_idx: int):
        super().__init__()
        self.self_attn = DDLmHCAttention(config=config, layer_idx=layer_idx)
        self.mlp = DDLmHCMLP(config)
        self.input_layernorm = DDLmHCRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = DDLmHCRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.attn_connection = HyperConnection(config)
        self.mlp_connection = HyperConnection(config)

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        streams: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = False,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """streams: (batch, seq, n, hidden) -> the same shape after attention and MLP updates."""
        # Self attention
        hidden_states, maps = self.attn_connection.read(streams, record=self.attn_connection.observed())
        hidden_states, _ = self.self_attn(
            hidden_states=self.input_layernorm(hidden_states),
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
            position_embeddings=position_embeddings,
            **kwargs,
        )
        streams, _ = self.attn_connection(streams, hidden_states, maps)

        # Fully connected
        hidden_states, maps = self.mlp_connection.read(streams, record=self.mlp_connection.observed())
        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
        streams, _ = self.mlp_connection(streams, hidden_states, maps)
        return streams


class DDLmHCPreTrainedModel(PretrainedIOMixin, PreTrainedModel):
    config: DDLmHCConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DDLmHCDecoderLayer"]
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True  # static cache (with the EC conv state) + torch.compile / torch.export
    _can_record_outputs = {
        "stream_states": [OutputRecorder(StreamExpansion), OutputRecorder(DDLmHCDecoderLayer)],
        "attentions": DDLmHCAttention,
        "mixing": HyperConnection,
    }

    def __init__(self, config: DDLmHCConfig, *inputs, **kwargs):
        config.validate()  # a config whose fields were set around the checks (e.g. through `__dict__`)
        register_one_element_parameters(config.model_type, ONE_ELEMENT_PARAMETERS)
        super().__init__(config, *inputs, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Linear/embedding/norm/rotary as transformers does; the DDL-mHC parameters start at the
        near-identity of docs/ddl_mhc.md, 'Hyper-connections': uniform read, H_res = (1 - a0) I + a0 chart(0),
        H_post = 1, beta = delta_beta_init, dynamic gates at hc_dynamic_gate_init, identity EC, mean
        read-out."""
        super()._init_weights(module)
        config = self.config
        if isinstance(module, HyperConnection):
            for bias in (module.pre_bias, module.res_bias):
                if bias is not None:
                    init.zeros_(bias)
            if module.write_bias is not None:
                beta_logit = beta_bias_for(config.delta_beta_init) if config.residual == "delta" else 0.0
                init.constant_(module.write_bias, beta_logit)
            for gate in (module.pre_gate, module.res_gate, module.write_gate):
                if gate is not None:
                    init.constant_(gate, config.hc_dynamic_gate_init)
            if module.res_mix_logit is not None:
                mix = config.hc_res_mix_init
                init.constant_(module.res_mix_logit, math.log(mix / (1.0 - mix)))
            if module.res_mix_logits is not None:
                init.copy_(module.res_mix_logits, lazy_mix_logits(config.hc_res_mix_init))
        elif isinstance(module, StreamExpansion) and module.weight is not None:
            identity = torch.zeros_like(module.weight)
            identity[:, 0, -1] = 1.0
            init.copy_(module.weight, identity)
        elif isinstance(module, StreamReadout):
            init.zeros_(module.logits)


class DDLmHCModel(DDLmHCPreTrainedModel):
    def __init__(self, config: DDLmHCConfig):
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size

        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.stream_expansion = StreamExpansion(config)
        self.layers = nn.ModuleList(
            [DDLmHCDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)]
        )
        self.stream_readout = StreamReadout(config.hc_streams) if config.hc_streams > 1 else None
        self.norm = DDLmHCRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = DDLmHCRotaryEmbedding(config=config)
        self.gradient_checkpointing = False

        # Initialize weights and apply final processing
        self.post_init()

    def _check_inputs(
        self,
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        attention_mask: torch.Tensor | dict | None,
        position_ids: torch.Tensor | None,
        cache: Cache | None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, int]:
        """Clear errors for bad arguments instead of an index or shape error deep inside (`input_checks.py`).
        Returns `input_ids` as int64 (any integer dtype is accepted), `inputs_embeds` in the embedding's dtype
        (any float dtype is accepted) and the cached length."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("You must specify exactly one of `input_ids` or `inputs_embeds`")
        past_length = check_cache(cache)
        config = self.config
        if input_ids is not None:
            input_ids = check_token_ids(input_ids, config.vocab_size)
            batch, length = input_ids.shape
        else:
            dtype = self.embed_tokens.weight.dtype
            bound = embeds_bound(dtype, config.hc_streams, config.hidden_size)
            inputs_embeds = check_inputs_embeds(inputs_embeds, config.hidden_size, dtype, bound)
            batch, length = inputs_embeds.shape[:2]
        heads, implementation = config.num_attention_heads, config._attn_implementation
        check_attention_mask(attention_mask, batch, length, past_length, cache, heads, implementation)
        check_position_ids(position_ids, batch, length)
        return input_ids, inputs_embeds, past_length

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    @merge_with_config_defaults
    @capture_outputs(tie_last_hidden_states=False)
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> DDLmHCModelOutputWithPast:
        input_ids, inputs_embeds, past_length = self._check_inputs(
            input_ids, inputs_embeds, attention_mask, position_ids, cache
        )

        if inputs_embeds is None:
            inputs_embeds: torch.Tensor = self.embed_tokens(input_ids)

        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)

        if position_ids is None:
            position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_length
            position_ids = position_ids.unsqueeze(0)

        # `generate` with a static cache hands over masks prepared per layer type (see config.layer_types)
        if isinstance(attention_mask, dict):
            causal_mask = attention_mask["full_attention"]
            padding_mask = attention_mask.get("linear_attention")
        else:
            causal_mask = create_causal_mask(
                config=self.config,
                inputs_embeds=inputs_embeds,
                attention_mask=attention_mask,
                cache=cache,
                position_ids=position_ids,
            )
            padding_mask = None  # only the EC convolution reads it; finding it all ones costs a host sync
            if self.stream_expansion.weight is not None:
                padding_mask = create_recurrent_attention_mask(self.config, inputs_embeds, attention_mask)

        streams = self.stream_expansion(inputs_embeds, cache=cache, padding_mask=padding_mask)
        position_embeddings = self.rotary_emb(inputs_embeds, position_ids=position_ids)

        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        boundaries = [] if output_hidden_states else None
        for decoder_layer in self.layers[: self.config.num_hidden_layers]:
            if boundaries is not None:
                hidden_states = self._read_out(streams)
                boundaries.append(hidden_states)
                streams = self._through_read_out(streams, hidden_states)
            streams = decoder_layer(
                streams,
                attention_mask=causal_mask,
                position_embeddings=position_embeddings,
                position_ids=position_ids,
                cache=cache,
                use_cache=use_cache,
                **kwargs,
            )

        hidden_states = self.norm(self._read_out(streams))
        all_hidden_states = None if boundaries is None else (*boundaries, hidden_states)
        return DDLmHCModelOutputWithPast(
            last_hidden_state=hidden_states, cache=cache, hidden_states=all_hidden_states
        )

    def _read_out(self, streams: torch.Tensor) -> torch.Tensor:
        """Streams (batch, seq, n, hidden) -> (batch, seq, hidden): the learned read-out (n = 1: X itself)."""
        return streams.squeeze(-2) if self.stream_readout is None else self.stream_readout(streams)

    def _through_read_out(self, streams: torch.Tensor, read_out: torch.Tensor) -> torch.Tensor:
        """X = r 1^T + (X - r' 1^T), r' the read-out recomputed: the streams rebuilt from their read-out r (a
        returned hidden state) so that r is on the gradient path with dL/dr = sum_j dL/dX_j, while the
        gradients of X and of the read-out weights are unchanged (r' cancels r's extra terms). Equal to X up
        to one rounding per element; for n = 1 it is r itself, as in Llama (docs/ddl_mhc.md, 'Outputs')."""
        if self.stream_readout is None:
            return read_out.unsqueeze(-2)
        return read_out.unsqueeze(-2) + (streams - self.stream_readout(streams).unsqueeze(-2))


class DDLmHCForCausalLM(DDLmHCPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _loss_function = staticmethod(causal_lm_loss)  # ForCausalLMLoss, 0 (not NaN) when no token is scored

    def __init__(self, config: DDLmHCConfig):
        super().__init__(config)
        self.model = DDLmHCModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

        # Initialize weights and apply final processing
        self.post_init()

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Unpack[TransformersKwargs],
    ) -> DDLmHCCausalLMOutputWithPast:
        r"""
        Llama's signature (`cache` is transformers 5's name for `past_key_values`, which is still accepted).
        labels: (batch, seq) token ids, -100 ignored; the loss is the shifted next-token cross-entropy, 0 when
            no token is scored (`causal_lm_loss.py`).
        Pass `output_mixing=True` to get the per-sublayer `StreamMixing` records.
        """
        check_logits_to_keep(logits_to_keep)
        if labels is not None:
            reference = input_ids if input_ids is not None else inputs_embeds
            shape = tuple(reference.shape[:2]) if isinstance(reference, torch.Tensor) else None
            labels = check_labels(labels, shape, self.config.vocab_size, logits_to_keep)
        outputs: DDLmHCModelOutputWithPast = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )

        hidden_states = outputs.last_hidden_state
        hidden_states = slice_logits_to_keep(hidden_states, logits_to_keep)
        logits = self.lm_head(hidden_states)

        loss = None
        if labels is not None:
            loss = self.loss_function(
                logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs
            )

        return DDLmHCCausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            hidden_states=outputs.hidden_states,
            stream_states=outputs.stream_states,
            attentions=outputs.attentions,
            mixing=outputs.mixing,
        )

    def init_continuous_batching(self, *args, **kwargs):
        """Continuous batching (`generate_batch`, `transformers serve --continuous-batching`) packs the
        requests into one sequence over a paged key/value cache (docs/serving.md): every stream op is per
        token, but the EC expansion convolves over the sequence and keeps a per-sequence state that the paged
        cache has no place for, so that configuration is refused here rather than mixing requests."""
        if "hybrid" in self.config.layer_types:
            raise ValueError(
                f"continuous batching cannot run `stream_expansion='conv'` (kernel "
                f"{self.config.stream_conv_kernel}): its causal convolution state is per sequence and the "
                "paged cache has no place for it; use `generate` (any cache) for this model, or a model with "
                "`stream_expansion='repeat'`"
            )
        return super().init_continuous_batching(*args, **kwargs)

    def _prepare_position_ids_for_generation(self, inputs_tensor, model_kwargs):
        """`generate` derives position ids from the attention mask: check the mask's shape first, so that
        a wrong one is named (`input_checks.check_generation_attention_mask`)."""
        if "input_ids" in model_kwargs and model_kwargs["input_ids"].shape[1] > 0:
            inputs_tensor = model_kwargs["input_ids"]
        cache = model_kwargs.get("cache")
        check_generation_attention_mask(model_kwargs.get("attention_mask"), inputs_tensor, cache)
        return super()._prepare_position_ids_for_generation(inputs_tensor, model_kwargs)


__all__ = ["DDLmHCForCausalLM", "DDLmHCModel", "DDLmHCPreTrainedModel"]
