"""Llama -> DDL-mHC conversion (upcycling, docs/upcycling.md): a `LlamaForCausalLM` becomes a
`DDLmHCForCausalLM` with the same weights. Module names coincide, so it is a state-dict copy; the maps Llama
lacks start where the model computes Llama's function:

- `residual="add"`, any n: equal streams (repeat / identity EC), H_post = 2 sigmoid(0) = 1 exactly (the
  dynamic write rows of `maps_proj` are zero), convex reads and a doubly-stochastic H_res, which map equal
  streams to themselves. Logits equal Llama's up to float rounding ("Exactness of the add update").
- `residual="delta"`: no setting equals the add update at a finite `delta_eps`; with value v = eps / beta
  and W_v = 0 the error per sublayer is O(||h||^2 / eps^2) ("The delta update").

At that point the streams are equal and the model is invariant to H_pre and H_res, so only the write maps
get gradients at first; `symmetry_breaking` picks how the exact start makes the streams' gradients (or the
streams themselves) differ ("Breaking the stream symmetry"): unequal reads of equal streams ("read_spread",
"wide_read_spread", "layer_read"), or uniform reads of streams written with unequal amplitudes of mean 1
("write_spread").

`load_llama` brings a checkpoint to convert: a local folder, a Hub id or a `.gguf` file (docs/upcycling.md,
"Loading a checkpoint")."""

import copy
import math
import os
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedModel
from transformers.utils import logging

from geoformers.model_io.strict_loading import DOWNLOAD_KWARGS
from geoformers.models.ddl_mhc.configuration_ddl_mhc import DDLmHCConfig
from geoformers.models.ddl_mhc.modeling_ddl_mhc import DDLmHCForCausalLM, HyperConnection

logger = logging.get_logger(__name__)

# The exact starts that break the stream-permutation symmetry (docs/upcycling.md, "Breaking the stream
# symmetry"); "read_spread" is the conversion's default.
SYMMETRY_BREAKING = ("read_spread", "wide_read_spread", "layer_read", "write_spread")
# Read logits b_pre = linspace(-spread, spread, n) of "read_spread" / "wide_read_spread": any convex read of
# equal streams is exact, and unequal weights make the write gradients differ per stream.
READ_SPREAD = 0.5
WIDE_READ_SPREAD = 2.0
# "layer_read" (hyper-connections' layer-indexed read): sublayer k reads stream k mod n with this weight.
LAYER_READ_WEIGHT = 0.7
# "write_spread": sublayer k writes H_post = 2 sigmoid(roll(linspace(-c, c, n), k)), c = WRITE_SPREAD (mean 1
# exactly, since 2 sigmoid(t) + 2 sigmoid(-t) = 2), and every read (and the read-out) is the mean.
WRITE_SPREAD = 1.0

# The architectures whose checkpoints convert (module names and residual stream of modeling_llama.py).
SUPPORTED_CLASSES = (LlamaForCausalLM,)
SUPPORTED_NAMES = ", ".join(
    f"{cls.__name__} (model_type {cls.config_class.model_type!r})" for cls in SUPPORTED_CLASSES
)

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


def load_llama(source, **from_pretrained_kwargs) -> LlamaForCausalLM:
    """A `LlamaForCausalLM` from `source`: a model (returned as is), a local folder, a Hub id (the local cache
    when offline) or a `.gguf` file (transformers' GGUF loader, weights de-quantized, float32 unless `dtype`
    is given). The result saves with `save_pretrained` (a GGUF model is rebuilt without its
    `quantization_config`); `from_pretrained_kwargs` go to `from_pretrained` (`dtype`, `revision`,
    `cache_dir`, `local_files_only`, ...). Another architecture raises a `ValueError` naming the supported
    classes (docs/upcycling.md, "Loading a checkpoint")."""
    if isinstance(source, PreTrainedModel):
        if not isinstance(source, SUPPORTED_CLASSES):
            raise TypeError(f"llama_model must be one of {SUPPORTED_NAMES}, got {type(source).__name__}")
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(
            f"llama_model must be a LlamaForCausalLM, a folder, a Hub id or a .gguf file, got "
            f"{type(source).__name__}"
        )
    path = Path(source)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"llama_model {str(source)!r}: no such .gguf file")
        kwargs = {"dtype": torch.float32, **from_pretrained_kwargs, "gguf_file": path.name}
        quantized = AutoModelForCausalLM.from_pretrained(path.parent, **kwargs)
        _check_architecture(quantized.config, source)
        return _without_quantization(quantized)
    try:
        config = AutoConfig.from_pretrained(
            source, **{key: value for key, value in from_pretrained_kwargs.items() if key in DOWNLOAD_KWARGS}
        )
    except OSError as error:
        where = (
            "a local folder"
            if path.exists()
            else "a local folder, nor a Hub id in reach (offline: the cache)"
        )
        raise OSError(
            f"llama_model {str(source)!r} is not a loadable checkpoint: it is neither {where} with a "
            f"config.json, nor a .gguf file ({error})"
        ) from error
    _check_architecture(config, source)
    return LlamaForCausalLM.from_pretrained(source, config=config, **from_pretrained_kwargs)


def _check_architecture(config, source) -> None:
    if not isinstance(config, LlamaConfig):
        raise ValueError(
            f"llama_model {str(source)!r} holds a {config.model_type!r} checkpoint "
            f"({', '.join(config.architectures or []) or 'no architectures listed'}); only {SUPPORTED_NAMES} "
            "converts to DDL-mHC"
        )


def _without_quantization(quantized: LlamaForCausalLM) -> LlamaForCausalLM:
    """A plain `LlamaForCausalLM` with the (de-quantized) weights, config and generation config of a model
    loaded through a quantizer (GGUF), which `save_pretrained` refuses."""
    config = copy.deepcopy(quantized.config)
    del config.quantization_config
    parameter = next(quantized.parameters())
    llama = LlamaForCausalLM(config).to(device=parameter.device, dtype=parameter.dtype)
    llama.load_state_dict(quantized.state_dict())
    llama.generation_config = copy.deepcopy(quantized.generation_config)
    return llama.train(quantized.training)


def convert_llama_to_ddl_mhc(
    llama_model, symmetry_breaking: str = "read_spread", **config_overrides
) -> DDLmHCForCausalLM:
    """Copy a `LlamaForCausalLM` into a `DDLmHCForCausalLM` (same dtype and device, same generation config).

    `llama_model` is a model or anything `load_llama` loads (a folder, a Hub id, a `.gguf` file).
    `config_overrides` are DDLmHCConfig fields (e.g. `hc_streams=4, residual="add"`); with none the result is
    the plain pre-norm ablation. With `residual="add"` the logits equal Llama's for every `hc_streams`, chart,
    expansion and `hc_dynamic`; with `residual="delta"` they approach Llama's as `delta_eps` grows
    (docs/upcycling.md). `symmetry_breaking`, one of `SYMMETRY_BREAKING`, chooses the exact start's maps
    (docs/upcycling.md, "Breaking the stream symmetry"). Invalid overrides raise the config's error naming the
    field."""
    if symmetry_breaking not in SYMMETRY_BREAKING:
        raise ValueError(f"symmetry_breaking must be one of {SYMMETRY_BREAKING}, got {symmetry_breaking!r}")
    llama_model = load_llama(llama_model)
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
    connections = [module for module in model.modules() if isinstance(module, HyperConnection)]
    with torch.no_grad():
        for index, connection in enumerate(connections):  # attention then MLP of each layer
            _start_as_llama(connection, config)
            if connection.num_streams > 1:
                _break_symmetry(connection, symmetry_breaking, index)
    model.generation_config = copy.deepcopy(llama_model.generation_config)
    model.train(llama_model.training)
    return model


def _start_as_llama(connection: HyperConnection, config: DDLmHCConfig) -> None:
    """Maps of one sublayer at the converted point (docs/upcycling.md): the write logit t_post / t_beta is
    its static bias, delta values v = eps / beta. The dynamic write term is gate * rows: the rows are zeroed
    unless the gate already is 0 (`hc_dynamic_gate_init=0`), so one factor of the product stays nonzero and
    the other gets gradients."""
    if connection.maps_proj is not None and connection.write_gate.item() != 0.0:
        connection.maps_proj.weight[sum(connection.map_sizes[:2]) :].zero_()
    if connection.delta is not None:
        beta = 2.0 * torch.sigmoid(connection.write_bias.float())
        connection.delta.value_proj.weight.zero_()
        connection.delta.value_proj.bias.copy_(config.delta_eps / beta)


def _break_symmetry(connection: HyperConnection, choice: str, index: int) -> None:
    """The exact start `choice` of sublayer `index` (0, 1, ... in forward order; docs/upcycling.md,
    "Breaking the stream symmetry"). Unequal reads need equal streams; unequal writes need uniform reads."""
    n = connection.num_streams
    if choice in ("read_spread", "wide_read_spread"):
        spread = READ_SPREAD if choice == "read_spread" else WIDE_READ_SPREAD
        connection.pre_bias.copy_(torch.linspace(-spread, spread, n))
        return
    if choice == "layer_read":
        chosen = math.log(LAYER_READ_WEIGHT * (n - 1) / (1.0 - LAYER_READ_WEIGHT))
        connection.pre_bias.zero_()[index % n] = chosen
        return
    # "write_spread": uniform reads for every token (the dynamic read rows zeroed unless their gate is), and
    # amplitudes a_i = 2 sigmoid(b_i) with mean 1, cycled over the sublayers
    connection.pre_bias.zero_()
    if connection.maps_proj is not None and connection.pre_gate.item() != 0.0:
        connection.maps_proj.weight[:n].zero_()
    logits = torch.linspace(-WRITE_SPREAD, WRITE_SPREAD, n).roll(index)
    if connection.delta is None:
        connection.write_bias.copy_(logits)
    else:  # v_i = (eps / beta) a_i: each stream's update is a_i h up to the bound of the delta conversion
        connection.delta.value_proj.bias.mul_(2.0 * torch.sigmoid(logits))


def _is_hyper_connection_parameter(name: str) -> bool:
    return "_connection." in name or name.startswith(("model.stream_expansion.", "model.stream_readout."))
