"""DDCL-INCRT encoder (docs/ddcl_incrt.md): embeddings -> layers (attention over a growable list of heads,
each head's output through its prototype block; no feed-forward block) -> pooling -> classifier. With
`config.bert_config` a (frozen) BERT encoder runs between the embeddings and the layers
(`wrap_bert_embeddings`). The file reads in forward order: embeddings, `DDCLIncrtHead`,
`eager_attention_forward`, `DDCLIncrtAttention` (transformers' attention interface: "sdpa" by default),
`DDCLIncrtLayer`, the encoder, the classifier (docs/ddcl_incrt.md, 'Attention implementations, output
capture, compile'). The prototype block is `prototypes.py`; the INCRT gate in each layer's attention and the
growth API (`grow_head`, `prune_head`, `gate_check`) are `incrt.py`.

Each layer is post-norm like BERT: h' = LayerNorm(h + dropout(sum_h W_O^h o_hat^h)), so every layer input,
which the INCRT gate reads, is layer-normalised. Loss = task loss (as BERT's: MSE, cross-entropy or BCE) +
lambda * mean L_q, the mean taken over layers, heads and real (non-padding) tokens. `config.num_heads` is the
single source of truth for the architecture; `grow_head`, `prune_head` and `resize_heads` edit it.

The standard outputs hold one row per example (batched pipelines split them); the DDCL batch statistics
(L_q parts, temperatures, prototype geometry) are returned only with `output_prototype_statistics=True`.
Checks that read tensor values run on CPU tensors only (`_checks_values`).
"""

from __future__ import annotations

# first: a transformers outside the supported range fails here, naming both (docs/versions.md)
from geoformers.models.transformers_range import TRANSFORMERS_REQUIREMENT  # noqa: F401

# isort: split

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig, PreTrainedModel
from transformers import initialization as init
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.bert.modeling_bert import BertEncoder
from transformers.utils import ModelOutput, can_return_tuple
from transformers.utils.output_capturing import capture_outputs

from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import DDCLIncrtConfig
from geoformers.models.ddcl_incrt.incrt import HeadGrowthMixin, IncrtGate, build_gate
from geoformers.models.ddcl_incrt.prototypes import (
    PrototypeBank,
    PrototypeOutput,
    assignment_perplexity,
    min_pairwise_distance,
    prototype_block,
    rho_for_temperature,
    temperature_from_rho,
)
from geoformers.models.one_element_parameters import register_one_element_parameters

ONE_ELEMENT_PARAMETERS = ("prototype_bank.rho",)  # stored 0-d before


try:  # in the package: saving, Hub code and strict loading (model_io), which a saved folder does not ship
    if not __name__.startswith("geoformers."):
        raise ImportError(f"{__name__} is a saved folder's copy")
    from geoformers.model_io.io_mixin import PretrainedIOMixin
except ImportError:  # a saved folder's copy, loaded as remote code: transformers' own saving and loading

    class PretrainedIOMixin:
        """Nothing added to transformers' `PreTrainedModel`."""


@dataclass
class DDCLIncrtModelOutput(ModelOutput):
    """Encoder output. last_hidden_state, pooler_output, hidden_states and attentions have the batch first.

    Only with `output_prototype_statistics=True`, the statistics of the whole batch (not per example):
    l_q, l_ols, prototype_variance: means of L_q = L_OLS + V over layers, heads and real tokens;
    temperatures, min_prototype_distance, prototype_perplexity: one (heads,) tensor per layer (detached):
    tau per head, min_{i != j} ||p_i - p_j|| per head, effective number of used prototypes per head.
    """

    last_hidden_state: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    l_q: torch.Tensor | None = None
    l_ols: torch.Tensor | None = None
    prototype_variance: torch.Tensor | None = None
    temperatures: tuple[torch.Tensor, ...] | None = None
    min_prototype_distance: tuple[torch.Tensor, ...] | None = None
    prototype_perplexity: tuple[torch.Tensor, ...] | None = None


@dataclass
class DDCLIncrtSequenceClassifierOutput(ModelOutput):
    """Classifier output: loss = task loss + prototype_loss_weight * l_q; the encoder's batch statistics only
    with `output_prototype_statistics=True` (as in `DDCLIncrtModelOutput`)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    l_q: torch.Tensor | None = None
    l_ols: torch.Tensor | None = None
    prototype_variance: torch.Tensor | None = None
    temperatures: tuple[torch.Tensor, ...] | None = None
    min_prototype_distance: tuple[torch.Tensor, ...] | None = None
    prototype_perplexity: tuple[torch.Tensor, ...] | None = None


class DDCLIncrtEmbeddings(nn.Module):
    """Word + learned position (+ token type) embeddings, LayerNorm, dropout; BERT's module names."""

    def __init__(self, config: DDCLIncrtConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(
            config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id
        )
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, config.hidden_size) if config.type_vocab_size > 0 else None
        )
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
    ) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        device = inputs_embeds.device
        positions = torch.arange(inputs_embeds.shape[1], device=device)
        embeddings = inputs_embeds + self.position_embeddings(positions)[None]
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros(inputs_embeds.shape[:2], dtype=torch.long, device=device)
            embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(embeddings))


class DDCLIncrtHead(nn.Module):
    """One head: q/k/v projections (hidden -> head_dim), its own prototype bank, o_proj (head_dim -> hidden).

    Its contribution to the layer is o_proj(prototype_block(softmax(q k^T / sqrt(D) + mask) v)).
    """

    def __init__(self, config: DDCLIncrtConfig):
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
        scale = self.q_proj.out_features**0.25
        for projection in (self.q_proj, self.k_proj):
            projection.weight[0] = scale * direction.to(projection.weight.dtype)
            projection.bias[0] = 0.0


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scaling + mask) v for (B, H, T, D) inputs, as transformers' eager attention: returns
    the output (B, T, H, D) and the probabilities (B, H, T, T). The mask is the additive float one of "eager",
    or the boolean one of "sdpa" (True: attend) when `output_attentions` runs this under "sdpa"."""
    scores = query @ key.transpose(2, 3) * scaling
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    elif attention_mask is not None:
        scores = scores + attention_mask
    probabilities = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    output = F.dropout(probabilities, p=dropout, training=module.training) @ value
    return output.transpose(1, 2).contiguous(), probabilities


class AttentionOutput(NamedTuple):
    output: torch.Tensor  # sum_h W_O^h o_hat^h, (B, T, hidden)
    attention_probs: torch.Tensor | None  # (B, H, T, T) when requested
    prototypes: PrototypeOutput
    temperatures: torch.Tensor  # tau per head, (H,)
    prototype_banks: torch.Tensor  # (H, K, D); read here, inside the layer, where FSDP2 has gathered them


class DDCLIncrtAttention(nn.Module):
    """Self-attention over a list of `DDCLIncrtHead`s that grows and shrinks (INCRT), each head with its own
    prototype bank (DDCL), plus the layer's `IncrtGate` deciding when (the growth API: `incrt.py`).

    The forward stacks the heads' q/k/v and runs all heads in one call of the attention function that
    `config._attn_implementation` names (transformers' attention interface: "sdpa" or "eager"); a call that
    returns the attention probabilities runs "eager" (docs/ddcl_incrt.md, 'Attention implementations').
    """

    def __init__(self, config: DDCLIncrtConfig, layer_index: int):
        super().__init__()
        self.config = config
        self.layer_index = layer_index
        self.scaling = config.head_dim**-0.5
        self.is_causal = False  # an encoder: "sdpa" must not read a missing mask as causal
        self.heads = nn.ModuleList([DDCLIncrtHead(config) for _ in range(config.num_heads[layer_index])])
        self.gate = build_gate(config, layer_index)

    def new_head(self) -> DDCLIncrtHead:
        """A new head for this layer (not yet initialised), on the device and dtype of its heads."""
        reference = self.heads[0].o_proj.weight
        return DDCLIncrtHead(self.config).to(device=reference.device, dtype=reference.dtype)

    def stacked(self, projection: str) -> torch.Tensor:
        """(H, D, hidden) weights of the heads' q_proj or k_proj (the gate's W_Q^h, W_K^h transposed)."""
        return torch.stack([getattr(head, projection).weight for head in self.heads])

    def temperatures(self) -> torch.Tensor:
        """Per-head tau = tau_min + softplus(rho), (H,)."""
        rho = torch.cat([head.prototype_bank.rho for head in self.heads])
        return temperature_from_rho(rho, self.config.tau_min)

    def prototype_banks(self) -> torch.Tensor:
        """(H, K, D) prototypes of all heads."""
        return torch.stack([head.prototype_bank.prototypes for head in self.heads])

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> AttentionOutput:
        """hidden_states (B, T, hidden); attention_mask: the (B, 1, T, T) mask of `create_bidirectional_mask`
        for the configured implementation, or None (no padding)."""
        # Each head's projections are called as modules (not fused from their weights) so that wrappers
        # such as PEFT's LoRA layers take part in the forward pass.
        query, key, value = (
            torch.stack([getattr(head, name)(hidden_states) for head in self.heads], dim=1)
            for name in ("q_proj", "k_proj", "v_proj")
        )
        attention_interface: Callable = eager_attention_forward
        if not output_attentions:
            attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
                self.config._attn_implementation, eager_attention_forward
            )
        attention_output, attention_probs = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.config.attention_probs_dropout_prob if self.training else 0.0,
            scaling=self.scaling,
        )
        head_outputs = attention_output.transpose(1, 2)  # (B, H, T, D), the prototype block's layout
        banks, temperatures = self.prototype_banks(), self.temperatures()
        prototypes = prototype_block(head_outputs, banks, temperatures)
        output = sum(head.o_proj(prototypes.output[:, index]) for index, head in enumerate(self.heads))
        return AttentionOutput(output, attention_probs, prototypes, temperatures, banks)


class DDCLIncrtLayer(GradientCheckpointingLayer):
    """Growable attention with prototype blocks, then residual + LayerNorm (post-norm); no FFN block.

    Under activation checkpointing (transformers' `GradientCheckpointingLayer`) the backward recomputes the
    layer, dropout masks included; its output holds the per-token L_q terms too, so the checkpoint must be
    the non-reentrant one (transformers' default): a reentrant checkpoint passes only top-level tensors on.
    """

    def __init__(self, config: DDCLIncrtConfig, layer_index: int):
        super().__init__()
        self.attention = DDCLIncrtAttention(config, layer_index)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, AttentionOutput]:
        attention = self.attention(hidden_states, attention_mask, output_attentions)
        hidden_states = self.LayerNorm(hidden_states + self.dropout(attention.output))
        return hidden_states, attention


def _masked_token_mean(values: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """Mean of per-token values (B, H, T) over heads and real tokens (token_mask (B, T), bool)."""
    weights = token_mask[:, None, :].to(values.dtype)
    return (values * weights).sum() / (weights.sum() * values.shape[1]).clamp_min(1.0)


def _prototype_statistics(attention: AttentionOutput, token_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """One layer's DDCL statistics: L_q, L_OLS and V averaged over heads and real tokens (differentiable),
    and per head (detached) tau, the minimum prototype distance and the assignment perplexity."""
    prototypes = attention.prototypes
    with torch.no_grad():
        banks = attention.prototype_banks.detach().float()
        detached = {
            "temperatures": attention.temperatures.detach(),
            "min_prototype_distance": min_pairwise_distance(banks),
            "prototype_perplexity": assignment_perplexity(prototypes.assignments.detach(), token_mask),
        }
    return {
        "l_q": _masked_token_mean(prototypes.l_q, token_mask),
        "l_ols": _masked_token_mean(prototypes.l_ols, token_mask),
        "prototype_variance": _masked_token_mean(prototypes.variance, token_mask),
        **detached,
    }


def _merge_layer_statistics(layers: list[dict[str, torch.Tensor]]) -> dict:
    """The statistics of `DDCLIncrtModelOutput`: losses averaged over layers, per-head ones per layer."""
    merged = {
        name: torch.stack([layer[name] for layer in layers]).mean()
        for name in ("l_q", "l_ols", "prototype_variance")
    }
    for name in ("temperatures", "min_prototype_distance", "prototype_perplexity"):
        merged[name] = tuple(layer[name] for layer in layers)
    return merged


def _pool(hidden_states: torch.Tensor, token_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """ "cls": the first token's state; "mean": the mean over real tokens."""
    if pooling == "cls":
        return hidden_states[:, 0]
    weights = token_mask[..., None].to(hidden_states.dtype)
    return (hidden_states * weights).sum(1) / weights.sum(1).clamp_min(1.0)


def _checks_values(tensor: torch.Tensor) -> bool:
    """Whether to run the checks that read tensor values (id ranges, 0/1 masks, finiteness): eagerly on CPU
    tensors. They are skipped while torch.compile / torch.export trace (a value check breaks the graph; a
    compiled model trusts its inputs, as transformers' own checks do) and on accelerators, where each would
    force a host sync per call."""
    return tensor.device.type == "cpu" and not torch.compiler.is_compiling()


def _require_tensor(name: str, value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"`{name}` must be a torch.Tensor, got {type(value).__name__} (tokenizers return "
            "tensors with return_tensors='pt')"
        )
    return value


def _integer_ids(name: str, ids) -> torch.Tensor:
    """Token or token-type ids as int64: integer tensors of any width are converted, bool/float refused."""
    ids = _require_tensor(name, ids)
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"`{name}` must be an integer tensor, got {ids.dtype}")
    return ids.long()


class DDCLIncrtPreTrainedModel(
    HeadGrowthMixin,
    PretrainedIOMixin,
    PreTrainedModel,
):
    """Weight initialisation, and the growth API (`incrt.HeadGrowthMixin`: grow_head, prune_head,
    resize_heads, gate_second_moments, gate_check) shared by the encoder and the classifier
    (docs/ddcl_incrt.md, 'Growth and pruning')."""

    config: DDCLIncrtConfig
    config_class = DDCLIncrtConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _can_compile_fullgraph = True
    _can_record_outputs = {"hidden_states": DDCLIncrtLayer, "attentions": DDCLIncrtAttention}
    _no_split_modules = ["DDCLIncrtLayer"]

    def __init__(self, config: DDCLIncrtConfig, *inputs, **kwargs):
        config.validate()  # fields assigned after the config was constructed are checked before any module
        register_one_element_parameters(config.model_type, ONE_ELEMENT_PARAMETERS)
        super().__init__(config, *inputs, **kwargs)

    def _init_weights(self, module: nn.Module) -> None:
        """BERT-style init for Linear/Embedding/LayerNorm; prototypes ~ N(0, s^2) with
        s = initializer_range * sqrt(hidden), the scale of v_proj outputs on layer-normalised inputs;
        tau = tau_init; fresh gate buffers."""
        super()._init_weights(module)
        if isinstance(module, PrototypeBank):
            std = self.config.initializer_range * math.sqrt(self.config.hidden_size)
            init.normal_(module.prototypes, std=std)
            init.constant_(module.rho, rho_for_temperature(module.tau_init, module.tau_min))
        elif isinstance(module, IncrtGate):
            for name, value in module.initial_state().items():
                init.copy_(getattr(module, name), value)


def _bert_encoder(bert_config: dict) -> BertEncoder:
    """The BERT encoder `config.bert_config` describes, on torch SDPA attention."""
    config = BertConfig.from_dict(bert_config)
    config._attn_implementation = "sdpa"
    return BertEncoder(config)


class DDCLIncrtModel(DDCLIncrtPreTrainedModel):
    """DDCL-INCRT encoder: embeddings (-> BERT encoder when `config.bert_config` is set) -> layers -> pooling
    ("cls": first token, "mean": real tokens). hidden_states[0] is the first layer's input."""

    def __init__(self, config: DDCLIncrtConfig):
        super().__init__(config)
        self.embeddings = DDCLIncrtEmbeddings(config)
        self.bert_encoder = _bert_encoder(config.bert_config) if config.bert_config is not None else None
        self.layers = nn.ModuleList(
            [DDCLIncrtLayer(config, index) for index in range(config.num_hidden_layers)]
        )
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    def _validated_inputs(self, input_ids, attention_mask, token_type_ids, inputs_embeds):
        """Check the inputs, naming the argument at fault; returns (input_ids and token_type_ids as int64,
        the (B, T) boolean mask of real tokens). Value checks run where `_checks_values` allows."""
        config = self.config
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of `input_ids` and `inputs_embeds`")
        if input_ids is not None:
            name, input_ids = "input_ids", _integer_ids("input_ids", input_ids)
            shape = tuple(input_ids.shape)
            if input_ids.dim() != 2:
                raise ValueError(f"`input_ids` must have shape (batch, sequence), got {shape}")
            if input_ids.numel() and _checks_values(input_ids):
                low, high = int(input_ids.min()), int(input_ids.max())
                if low < 0 or high >= config.vocab_size:
                    raise ValueError(
                        f"`input_ids` must lie in [0, vocab_size={config.vocab_size}), got "
                        f"values in [{low}, {high}]"
                    )
        else:
            name, inputs_embeds = "inputs_embeds", _require_tensor("inputs_embeds", inputs_embeds)
            if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != config.hidden_size:
                raise ValueError(
                    f"`inputs_embeds` must have shape (batch, sequence, {config.hidden_size}), got "
                    f"{tuple(inputs_embeds.shape)}"
                )
            if inputs_embeds.dtype != self.dtype:
                raise TypeError(
                    f"`inputs_embeds` must have the model's dtype {self.dtype}, got {inputs_embeds.dtype}"
                )
            if _checks_values(inputs_embeds) and not bool(torch.isfinite(inputs_embeds).all()):
                raise ValueError("`inputs_embeds` must be finite (it contains NaN or inf)")
            shape = tuple(inputs_embeds.shape[:2])
        if shape[0] == 0:
            raise ValueError(f"`{name}` has batch size 0: pass at least one sequence")
        if shape[1] < 1 or shape[1] > config.max_position_embeddings:
            raise ValueError(
                f"`{name}` has sequence length {shape[1]}, which must lie in [1, "
                f"max_position_embeddings={config.max_position_embeddings}]"
            )
        device = input_ids.device if input_ids is not None else inputs_embeds.device
        if token_type_ids is not None:
            token_type_ids = _integer_ids("token_type_ids", token_type_ids)
            if tuple(token_type_ids.shape) != shape:
                raise ValueError(
                    f"`token_type_ids` must have shape {shape}, got {tuple(token_type_ids.shape)}"
                )
            if config.type_vocab_size == 0:
                raise ValueError("`token_type_ids` given but the config has `type_vocab_size` = 0")
            if _checks_values(token_type_ids) and (
                token_type_ids.min() < 0 or token_type_ids.max() >= config.type_vocab_size
            ):
                raise ValueError(
                    f"`token_type_ids` must lie in [0, type_vocab_size={config.type_vocab_size})"
                )
        if attention_mask is None:
            return input_ids, token_type_ids, torch.ones(shape, dtype=torch.bool, device=device)
        attention_mask = _require_tensor("attention_mask", attention_mask)
        if tuple(attention_mask.shape) != shape:
            raise ValueError(
                f"`attention_mask` must have shape {shape} like the inputs, got {tuple(attention_mask.shape)}"
            )
        if attention_mask.dtype.is_complex:
            raise TypeError(
                f"`attention_mask` must be a bool, integer or float tensor, got {attention_mask.dtype}"
            )
        token_mask = attention_mask.to(device) != 0
        if _checks_values(attention_mask):
            if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
                raise ValueError("`attention_mask` must contain only 0 (padding) and 1 (token)")
            empty = (~token_mask.any(dim=1)).nonzero()
            if empty.numel():
                raise ValueError(f"`attention_mask` row {int(empty[0])} has no tokens")
            if config.pooling == "cls" and not bool(token_mask[:, 0].all()):
                raise ValueError(
                    "`attention_mask` marks position 0 as padding, but pooling='cls' reads position 0 "
                    "(pad on the right, or use pooling='mean')"
                )
        return input_ids, token_type_ids, token_mask

    def _check_config_matches_modules(self) -> None:
        """Architecture fields assigned after the model was built must still describe its modules."""
        config = self.config
        embeddings = self.embeddings
        attention = self.layers[0].attention
        built = {
            "hidden_size": embeddings.word_embeddings.embedding_dim,
            "vocab_size": embeddings.word_embeddings.num_embeddings,
            "max_position_embeddings": embeddings.position_embeddings.num_embeddings,
            "num_hidden_layers": len(self.layers),
            "head_dim": attention.heads[0].q_proj.out_features,
            "num_prototypes": attention.heads[0].prototype_bank.prototypes.shape[0],
            "max_heads": attention.gate.basis.shape[0],
        }
        for name, value in built.items():
            if getattr(config, name) != value:
                raise ValueError(
                    f"`config.{name}` = {getattr(config, name)!r} but the model was built with "
                    f"{value}: build a new model from the edited config"
                )
        if config.pooling not in ("cls", "mean"):
            raise ValueError(f"`config.pooling` must be 'cls' or 'mean', got {config.pooling!r}")
        for index, layer in enumerate(self.layers):
            if len(layer.attention.heads) != config.num_heads[index]:
                raise ValueError(
                    f"`config.num_heads[{index}]` = {config.num_heads[index]} but layer {index} has "
                    f"{len(layer.attention.heads)} heads: change heads with grow_head, prune_head or "
                    "resize_heads"
                )

    @capture_outputs
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        *,
        output_attentions: bool | None = None,
        output_hidden_states: bool | int | list[int] | None = None,
        output_prototype_statistics: bool | None = None,
    ) -> DDCLIncrtModelOutput:
        r"""
        output_attentions, output_hidden_states:
            As in transformers: `capture_outputs` records them with hooks (`_can_record_outputs`); the
            attention probabilities come from the eager attention function whatever the configured one.
        output_prototype_statistics (`bool`, *optional*):
            Add the DDCL statistics of the whole batch (`l_q`, `l_ols`, `prototype_variance`, `temperatures`,
            `min_prototype_distance`, `prototype_perplexity`) to the output. Off by default, so that every
            returned tensor has one row per example.
        """
        config = self.config
        output_attentions = config.output_attentions if output_attentions is None else output_attentions
        self._check_config_matches_modules()
        input_ids, token_type_ids, token_mask = self._validated_inputs(
            input_ids, attention_mask, token_type_ids, inputs_embeds
        )

        hidden_states = self.embeddings(input_ids, token_type_ids, inputs_embeds)
        if inputs_embeds is not None and _checks_values(hidden_states) and not hidden_states.isfinite().all():
            largest = float(inputs_embeds.abs().max())
            raise ValueError(
                f"`inputs_embeds` are too large: their embedding LayerNorm overflows "
                f"{hidden_states.dtype} (largest |value| {largest:.3g})"
            )
        if self.bert_encoder is not None:
            bert_mask = create_bidirectional_mask(
                self.bert_encoder.config, hidden_states, token_mask.long(), allow_is_bidirectional_skip=False
            )  # the skip test reads the mask's values: a host sync on an accelerator
            hidden_states = self.bert_encoder(hidden_states, attention_mask=bert_mask).last_hidden_state
        key_mask = None  # no mask: every key attends
        if attention_mask is not None:  # built even when all ones: skipping it would read its values
            key_mask = create_bidirectional_mask(
                config, hidden_states, token_mask, allow_is_bidirectional_skip=False
            )
        layer_statistics = []
        for layer in self.layers:
            hidden_states, attention = layer(
                hidden_states, attention_mask=key_mask, output_attentions=output_attentions
            )
            if output_prototype_statistics:
                layer_statistics.append(_prototype_statistics(attention, token_mask))

        pooled = _pool(hidden_states, token_mask, config.pooling)
        statistics = _merge_layer_statistics(layer_statistics) if output_prototype_statistics else {}
        return DDCLIncrtModelOutput(last_hidden_state=hidden_states, pooler_output=pooled, **statistics)


class DDCLIncrtForSequenceClassification(DDCLIncrtPreTrainedModel):
    """DDCL-INCRT encoder + dropout + linear classifier; loss = CE + prototype_loss_weight * mean L_q."""

    def __init__(self, config: DDCLIncrtConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = DDCLIncrtModel(config)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_prototype_statistics: bool | None = None,
    ) -> DDCLIncrtSequenceClassifierOutput:
        r"""
        labels (`torch.Tensor`, *optional*):
            As for `BertForSequenceClassification`: class indices (batch,) for cross-entropy (-100 =
            ignored), targets (batch,) or (batch, num_labels) for regression (num_labels = 1), multi-hot
            (batch, num_labels) for "multi_label_classification".
        output_prototype_statistics (`bool`, *optional*):
            Add the encoder's batch statistics (see `DDCLIncrtModelOutput`) to the output.
        """
        config = self.config
        outputs = self.model(  # `capture_outputs` reads a flag given as None as off: pass the config's
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=config.output_attentions if output_attentions is None else output_attentions,
            output_hidden_states=(
                config.output_hidden_states if output_hidden_states is None else output_hidden_states
            ),
            return_dict=True,
            output_prototype_statistics=bool(output_prototype_statistics) or labels is not None,
        )
        logits = self.classifier(self.dropout(outputs.pooler_output))
        loss = None
        if labels is not None:
            loss = self._task_loss(logits, labels) + self.config.prototype_loss_weight * outputs.l_q
        statistics = {}
        if output_prototype_statistics:
            statistics = {
                name: outputs[name]
                for name in (
                    "l_q",
                    "l_ols",
                    "prototype_variance",
                    "temperatures",
                    "min_prototype_distance",
                    "prototype_perplexity",
                )
            }
        return DDCLIncrtSequenceClassifierOutput(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            **statistics,
        )

    def _task_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The task loss as `BertForSequenceClassification` chooses it: `problem_type`, else regression (MSE)
        for num_labels = 1, cross-entropy for integer labels, BCE with logits otherwise; float32 or wider.
        Cross-entropy skips labels of -100 and is 0 when every label is -100 (summed over the counted rows,
        divided by max(count, 1), as transformers' loss helpers do)."""
        labels = _require_tensor("labels", labels)
        batch, num_labels = logits.shape
        dtype = labels.dtype
        integer = not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
        problem_type = self.config.problem_type
        if problem_type is None:
            if num_labels == 1:
                problem_type = "regression"
            else:
                problem_type = "single_label_classification" if integer else "multi_label_classification"
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        if problem_type == "single_label_classification":
            if labels.shape != (batch,) or not integer:
                raise ValueError(
                    f"`labels` must be an integer tensor of shape ({batch},) for "
                    f"single-label classification, got {labels.dtype} {tuple(labels.shape)}"
                )
            labels = labels.long()
            counted = labels != -100
            if _checks_values(labels) and not bool(((labels >= 0) & (labels < num_labels) | ~counted).all()):
                raise ValueError(f"`labels` must lie in [0, num_labels={num_labels}) or be -100 (ignored)")
            total = F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
            return total / counted.sum().clamp_min(1)
        if labels.dtype.is_complex or labels.shape not in ((batch, num_labels), (batch,) * (num_labels == 1)):
            expected = f"({batch}, {num_labels})" + (f" or ({batch},)" if num_labels == 1 else "")
            raise ValueError(
                f"`labels` must be a real tensor of shape {expected} for {problem_type}, got "
                f"{labels.dtype} {tuple(labels.shape)}"
            )
        targets = labels.reshape(batch, num_labels).to(logits.dtype)
        if problem_type == "regression":
            if _checks_values(targets) and not bool(targets.isfinite().all()):
                raise ValueError("`labels` must be finite for regression")
            return F.mse_loss(logits, targets)
        if _checks_values(targets) and not bool(((targets >= 0) & (targets <= 1)).all()):
            raise ValueError("`labels` must lie in [0, 1] for multi_label_classification")
        return F.binary_cross_entropy_with_logits(logits, targets)


__all__ = [
    "DDCLIncrtPreTrainedModel",
    "DDCLIncrtModel",
    "DDCLIncrtForSequenceClassification",
    "DDCLIncrtModelOutput",
    "DDCLIncrtSequenceClassifierOutput",
]
