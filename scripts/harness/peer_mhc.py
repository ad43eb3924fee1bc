"""A peer for the DDL-mHC benchmark: transformers' Llama blocks with the `hyper-connections` package's mHC.

`hyper-connections` (PyPI, lucidrains) is the most used public mHC implementation (Xie et al. 2025,
"mHC: Manifold-Constrained Hyper-Connections", on Zhu et al. 2024, "Hyper-Connections", Algorithm 2). This
harness wraps each attention and each MLP sublayer of a Llama stack (transformers' own `LlamaAttention`,
`LlamaMLP`, `LlamaRMSNorm`, `LlamaRotaryEmbedding`, pre-norm inside the branch as in Llama) in one
`hyper_connections.mHC` (= `ManifoldConstrainedHyperConnections`), expands the embedding into `n` streams
and sums them back before the final norm, as the package's README and its `vit.py` do. The loss is
`LlamaForCausalLM`'s (`ForCausalLMLoss`: shifted next-token cross-entropy).

The package's mHC is used with its defaults (`mHC.get_init_and_expand_reduce_stream_functions(n)`):
H_res = Sinkhorn-Knopp in the probability domain, 20 iterations (`sinkhorn_iters=20`,
`log_domain_sinkhorn=False`), H_pre = sigmoid, H_post = 2 sigmoid, one dynamic proposal, no fractions, no
stream embedding, sum reduction, no dropout. Dynamic maps are linear in an RMS-normed copy of each stream,
scaled by learned gates initialised to 1e-2 (dynamic weights initialised to zero). At init every stream
equals the embedding, H_res = Sinkhorn(exp(I)) (diagonal e / (e + n - 1)), H_pre = sigmoid of a one-hot
row (stream `layer_index mod n`), H_post = 2 sigmoid(1): the model is then a Llama whose sublayer outputs
are scaled by 2 sigmoid(1) (exactly so up to the RMSNorm epsilon, since the branch and final norms see the
stream scaled by sigmoid(1) + (n - 1) / 2 and by n). `layer_index` is the sublayer's index (the package
picks a random stream when it is not given). At n = 1 the package disables itself (plain residual):
the model is `LlamaForCausalLM` exactly. No KV cache: this peer trains; it does not generate.

    from peer_mhc import build_peer_mhc_llama
    model = build_peer_mhc_llama(LlamaConfig(vocab_size=65, hidden_size=128, ...), num_streams=4)
    loss = model(input_ids, labels=input_ids).loss
"""

import torch
from hyper_connections import mHC
from torch import nn
from transformers import LlamaConfig
from transformers.masking_utils import create_causal_mask
from transformers.modeling_outputs import CausalLMOutput
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaMLP,
    LlamaPreTrainedModel,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)


class PeerMHCDecoderLayer(nn.Module):
    """`LlamaDecoderLayer` with each residual connection replaced by one package mHC (its sublayer index as
    `layer_index`); the streams travel folded into the batch, `(batch * n, seq, hidden)`, as in the
    package."""

    def __init__(self, config: LlamaConfig, layer_idx: int, init_hyper_conn):
        super().__init__()
        self.self_attn = LlamaAttention(config=config, layer_idx=layer_idx)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.attn_hc = init_hyper_conn(dim=config.hidden_size, layer_index=2 * layer_idx)
        self.mlp_hc = init_hyper_conn(dim=config.hidden_size, layer_index=2 * layer_idx + 1)

    def forward(self, streams, attention_mask, position_embeddings) -> torch.Tensor:
        branch_input, add_residual = self.attn_hc(streams)
        hidden_states, _ = self.self_attn(
            hidden_states=self.input_layernorm(branch_input),
            attention_mask=attention_mask,
            position_embeddings=position_embeddings,
        )
        streams = add_residual(hidden_states)

        branch_input, add_residual = self.mlp_hc(streams)
        return add_residual(self.mlp(self.post_attention_layernorm(branch_input)))


class PeerMHCModel(nn.Module):
    """`LlamaModel`'s trunk (same module names) between the package's stream expansion and reduction."""

    def __init__(self, config: LlamaConfig, num_streams: int):
        super().__init__()
        hc_functions = mHC.get_init_and_expand_reduce_stream_functions(num_streams)
        init_hyper_conn, self.expand_streams, self.reduce_streams = hc_functions
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(
            [PeerMHCDecoderLayer(config, i, init_hyper_conn) for i in range(config.num_hidden_layers)]
        )
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config=config)
        self.config = config

    def forward(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None):
        inputs_embeds = self.embed_tokens(input_ids)
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            cache=None,
            position_ids=position_ids,
        )
        position_embeddings = self.rotary_emb(inputs_embeds, position_ids=position_ids)

        streams = self.expand_streams(inputs_embeds)
        for layer in self.layers:
            streams = layer(streams, causal_mask, position_embeddings)
        return self.norm(self.reduce_streams(streams))


class PeerMHCLlamaForCausalLM(LlamaPreTrainedModel):
    """Causal LM over `PeerMHCModel`; Llama's weight init for the Llama parts, the package's for its mHC."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: LlamaConfig, num_streams: int):
        super().__init__(config)
        self.model = PeerMHCModel(self.config, num_streams)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.num_streams = num_streams
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor,
        labels: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> CausalLMOutput:
        logits = self.lm_head(self.model(input_ids, attention_mask))
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size)
        return CausalLMOutput(loss=loss, logits=logits)


def build_peer_mhc_llama(llama_config: LlamaConfig, num_streams: int = 4) -> PeerMHCLlamaForCausalLM:
    """The Llama stack of `llama_config` with the `hyper-connections` package's mHC, `num_streams` streams."""
    if not isinstance(llama_config, LlamaConfig):
        raise TypeError(f"llama_config must be a transformers.LlamaConfig, got {type(llama_config).__name__}")
    if isinstance(num_streams, bool) or not isinstance(num_streams, int):
        raise TypeError(f"num_streams must be an int, got {type(num_streams).__name__} {num_streams!r}")
    if num_streams < 1:
        raise ValueError(f"num_streams must be >= 1, got {num_streams}")
    return PeerMHCLlamaForCausalLM(llama_config, num_streams)
