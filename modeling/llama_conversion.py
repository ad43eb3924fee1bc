"""Llama -> DDL-mHC conversion (docs/ddl_mhc.md, 'Hyper-connections': ablations): a `LlamaForCausalLM` becomes
a `DDLmHCForCausalLM` with the same weights. Module names coincide, so it is a state-dict copy; with the
defaults (`hc_streams=1, residual="add"`) the result computes exactly Llama's logits and loss. Other
hyper-connection settings (e.g. `hc_streams=4, residual="add"`) start from the Llama weights with fresh,
near-identity maps."""

from transformers import LlamaForCausalLM

from ..configuration.ddl_mhc import DDLmHCConfig
from .ddl_mhc import DDLmHCForCausalLM

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
    the plain pre-norm ablation and its logits equal Llama's. Parameters Llama lacks (hyper-connection maps,
    delta gates) keep their near-identity initialisation."""
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
    model.train(llama_model.training)
    return model


def _is_hyper_connection_parameter(name: str) -> bool:
    return "_connection." in name or name.startswith(("model.stream_expansion.", "model.stream_readout."))
