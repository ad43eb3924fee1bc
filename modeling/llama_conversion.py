"""Llama -> DDL-mHC conversion (upcycling, docs/upcycling.md): a `LlamaForCausalLM` becomes a
`DDLmHCForCausalLM` with the same weights. Module names coincide, so it is a state-dict copy; the maps Llama
lacks start where the model computes Llama's function:

- `residual="add"`, any n: equal streams (repeat / identity EC), H_post = 2 sigmoid(0) = 1 exactly (the
  dynamic write rows of `maps_proj` are zero), convex reads and a doubly-stochastic H_res, which map equal
  streams to themselves. Logits equal Llama's up to float rounding ("Exactness of the add update").
- `residual="delta"`: no setting equals the add update at a finite `delta_eps`; with value v = eps / beta
  and W_v = 0 the error per sublayer is O(||h||^2 / eps^2) ("The delta update").

At that point the streams are equal and the model is invariant to H_pre and H_res, so only the write maps
get gradients at first; the read weights start unequal (`READ_SPREAD`) so that those gradients differ per
stream and the streams diverge in training ("Training from the converted point")."""

import torch
from transformers import LlamaForCausalLM
from transformers.utils import logging

from geoformers.configuration.ddl_mhc import DDLmHCConfig
from geoformers.modeling.ddl_mhc import DDLmHCForCausalLM, HyperConnection

logger = logging.get_logger(__name__)

# Read logits b_pre = linspace(-READ_SPREAD, READ_SPREAD, n): any convex read of equal streams is exact, and
# unequal weights make the write gradients differ per stream (docs/upcycling.md, "Training from the
# converted point").
READ_SPREAD = 0.5

# Llama config fields that carry over unchanged (same name, same meaning).
SHARED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_act",
    "max_position_embeddings",
    "initializer_range",
    "rms_norm_eps",
    "use_cache",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "tie_word_embeddings",
    "attention_bias",
    "attention_dropout",
    "mlp_bias",
)


def ddl_mhc_config_from_llama(llama_config, **overrides) -> DDLmHCConfig:
    """`DDLmHCConfig` with the Llama decoder fields, `hc_streams=1, residual="add"` unless overridden."""
    head_dim = getattr(llama_config, "head_dim", None)
    if head_dim is not None and head_dim * llama_config.num_attention_heads != llama_config.hidden_size:
        raise ValueError(
            f"llama_model.config.head_dim={head_dim} differs from hidden_size / num_attention_heads = "
            f"{llama_config.hidden_size // llama_config.num_attention_heads}; DDL-mHC derives the head size"
        )
    if getattr(llama_config, "pretraining_tp", 1) not in (None, 1):
        raise ValueError(f"llama_model.config.pretraining_tp must be 1, got {llama_config.pretraining_tp}")
    fields = {name: getattr(llama_config, name) for name in SHARED_FIELDS}
    fields["rope_parameters"] = dict(llama_config.rope_parameters)
    fields.update(hc_streams=1, residual="add")
    fields.update(overrides)
    return DDLmHCConfig(**fields)


def convert_llama_to_ddl_mhc(llama_model: LlamaForCausalLM, **config_overrides) -> DDLmHCForCausalLM:
    """Copy a `LlamaForCausalLM` into a `DDLmHCForCausalLM` (same dtype and device).

    `config_overrides` are DDLmHCConfig fields (e.g. `hc_streams=4, residual="add"`); with none the result is
    the plain pre-norm ablation. With `residual="add"` the logits equal Llama's for every `hc_streams`, chart,
    expansion and `hc_dynamic`; with `residual="delta"` they approach Llama's as `delta_eps` grows
    (docs/upcycling.md). Invalid overrides raise the config's error naming the field."""
    if not isinstance(llama_model, LlamaForCausalLM):
        raise TypeError(f"llama_model must be a LlamaForCausalLM, got {type(llama_model).__name__}")
    config = ddl_mhc_config_from_llama(llama_model.config, **config_overrides)
    config._attn_implementation = llama_model.config._attn_implementation
    parameter = next(llama_model.parameters())
    model = DDLmHCForCausalLM(config).to(device=parameter.device, dtype=parameter.dtype)
    missing, unexpected = model.load_state_dict(llama_model.state_dict(), strict=False)
    if unexpected:
        raise ValueError(f"llama_model has weights DDL-mHC cannot hold: {sorted(unexpected)[:5]}")
    not_copied = [name for name in missing if not _is_hyper_connection_parameter(name)]
    if not_copied:
        raise ValueError(f"llama_model lacks weights DDL-mHC needs: {sorted(not_copied)[:5]}")
    if config.residual == "delta" and config.delta_eps < 1.0:
        logger.warning(
            f"residual='delta' with delta_eps={config.delta_eps}: the delta write can only approach Llama's "
            "add when delta_eps >> ||h||, the converted model does not start as Llama (docs/upcycling.md)"
        )
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, HyperConnection):
                _start_as_llama(module, config)
    model.train(llama_model.training)
    return model


def _start_as_llama(connection: HyperConnection, config: DDLmHCConfig) -> None:
    """Maps of one sublayer at the converted point (docs/upcycling.md): the write logit t_post / t_beta is
    its static bias, delta values v = eps / beta, and unequal read biases. The dynamic write term is
    gate * rows: the rows are zeroed unless the gate already is 0 (`hc_dynamic_gate_init=0`), so one factor
    of the product stays nonzero and the other gets gradients."""
    if connection.maps_proj is not None and connection.write_gate.item() != 0.0:
        read_and_mix = sum(connection.map_sizes[:2])
        connection.maps_proj.weight[read_and_mix:].zero_()
    if connection.delta is not None:
        beta = 2.0 * torch.sigmoid(connection.write_bias.float())
        connection.delta.value_proj.weight.zero_()
        connection.delta.value_proj.bias.copy_(config.delta_eps / beta)
    if connection.pre_bias is not None:
        spread = torch.linspace(-READ_SPREAD, READ_SPREAD, connection.num_streams)
        connection.pre_bias.copy_(spread)


def _is_hyper_connection_parameter(name: str) -> bool:
    return "_connection." in name or name.startswith(("model.stream_expansion.", "model.stream_readout."))
