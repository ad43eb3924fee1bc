"""DDL-mHC causal LM (docs/ddl_mhc.md): a Llama decoder whose residual stream is n hyper-connection streams,
mixed by an exactly doubly-stochastic H_res and updated by the Deep Delta rule

    X' = H_res X (I - beta k k^T) + beta v k^T   (delta)    or    X' = H_res X + H_post^T h   (add, mHC)

around both sublayers of every layer. Norm, rotary embedding, MLP and attention are transformers' Llama
modules (the attention goes through `ALL_ATTENTION_FUNCTIONS`: eager, sdpa, ...); the stream maps live in
`hyper_connections.py` and the delta write in `delta.py`. `hc_streams=1, residual="add"` is exactly
`LlamaForCausalLM` (same module names, so `llama_conversion.py` is a state-dict copy).
"""

import math
from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
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
from transformers.utils import can_return_tuple
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from geoformers.configuration.ddl_mhc import DDLmHCConfig
from geoformers.modeling.atomic_save import AtomicSaveMixin
from geoformers.modeling.causal_lm_loss import causal_lm_loss
from geoformers.modeling.delta import beta_bias_for
from geoformers.modeling.hub_code import HubCodeMixin
from geoformers.modeling.hyper_connections import (
    HyperConnection,
    StreamExpansion,
    StreamMixing,
    StreamReadout,
    lazy_mix_logits,
)
from geoformers.modeling.input_checks import (
    check_attention_mask,
    check_cache,
    check_inputs_embeds,
    check_labels,
    check_position_ids,
    check_token_ids,
    embeds_bound,
)
from geoformers.modeling.strict_loading import StrictLoadingMixin


class DDLmHCRMSNorm(LlamaRMSNorm):
    """Llama's RMSNorm (statistics in float32)."""


class DDLmHCRotaryEmbedding(LlamaRotaryEmbedding):
    """Llama's rotary embedding, driven by `config.rope_parameters` (any transformers RoPE type)."""


class DDLmHCMLP(LlamaMLP):
    """Llama's gated MLP: down_proj(act(gate_proj(x)) * up_proj(x))."""


class DDLmHCAttention(LlamaAttention):
    """Llama's RoPE attention with grouped key/value heads, `DynamicCache` updates and the attention
    backend chosen by `config._attn_implementation` (eager and sdpa agree)."""


@dataclass
class DDLmHCModelOutputWithPast(BaseModelOutputWithPast):
    r"""
    hidden_states: with `output_hidden_states=True`, one (batch, seq, hidden) tensor per layer boundary, as
        every causal LM returns: the read-out of the streams entering each layer, and last the final normed
        hidden state (`last_hidden_state`); with `hc_streams=1` exactly Llama's hidden states.
    stream_states: with `output_stream_states=True`, the stream states X (batch, seq, n, hidden) entering
        every layer and leaving the last one (before the read-out and final norm).
    mixing: with `output_mixing=True`, one `StreamMixing(h_res, beta, direction)` per sublayer (attention
        then MLP of each layer): the per-token linear part X -> H_res X (I - beta k k^T) of the update.
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
        hidden_states, maps = self.attn_connection.read(streams)
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
        hidden_states, maps = self.mlp_connection.read(streams)
        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
        streams, _ = self.mlp_connection(streams, hidden_states, maps)
        return streams


class DDLmHCPreTrainedModel(StrictLoadingMixin, AtomicSaveMixin, HubCodeMixin, PreTrainedModel):
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
        check_cache(cache)
        past_length = cache.get_seq_length() if cache is not None else 0
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
        **kwargs,
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
            padding_mask = create_recurrent_attention_mask(self.config, inputs_embeds, attention_mask)

        streams = self.stream_expansion(inputs_embeds, cache=cache, padding_mask=padding_mask)
        position_embeddings = self.rotary_emb(inputs_embeds, position_ids=position_ids)

        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        boundaries = [] if output_hidden_states else None
        for decoder_layer in self.layers[: self.config.num_hidden_layers]:
            if boundaries is not None:
                boundaries.append(self._read_out(streams))
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
        **kwargs,
    ) -> DDLmHCCausalLMOutputWithPast:
        r"""
        Llama's signature (`cache` is transformers 5's name for `past_key_values`, which is still accepted).
        labels: (batch, seq) token ids, -100 ignored; the loss is the shifted next-token cross-entropy, 0 when
            no token is scored (`causal_lm_loss.py`).
        Pass `output_mixing=True` to get the per-sublayer `StreamMixing` records.
        """
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


__all__ = ["DDLmHCForCausalLM", "DDLmHCModel", "DDLmHCPreTrainedModel"]
