"""BERT -> DDCL-INCRT conversion (docs/ddcl_incrt.md, 'BERT conversion'): a pre-trained BERT's embeddings, and
optionally its encoder, feed freshly initialised DDCL-INCRT layers; the BERT part is frozen.

DDCL-INCRT's embeddings use BERT's module names (word/position/token-type embeddings, LayerNorm), so
BERT's embedding weights load into them unchanged, and the DDCL-INCRT embedding output equals BERT's. With
`use_encoder_outputs=True` the config records BERT's encoder shape in `bert_config`, so the wrapped model
saves and reloads (`AutoModelForSequenceClassification.from_pretrained`) with the same structure.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from torch import nn
from transformers import AutoConfig, BertModel

from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import DDCLIncrtConfig
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtForSequenceClassification

# DDCL-INCRT config fields that must match the BERT checkpoint (its weights are copied into them).
BERT_SHAPED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "max_position_embeddings",
    "type_vocab_size",
    "pad_token_id",
    "layer_norm_eps",
)


def load_bert(bert_name_or_path: str | os.PathLike) -> BertModel:
    """`BertModel` from a local checkpoint folder (offline); any other string is tried as a hub name."""
    if not isinstance(bert_name_or_path, (str, os.PathLike)):
        raise TypeError(
            f"`bert_name_or_path` must be a path or a hub name, got {type(bert_name_or_path).__name__}"
        )
    local = Path(bert_name_or_path).is_dir()
    config = AutoConfig.from_pretrained(bert_name_or_path, local_files_only=local)
    if config.model_type != "bert":
        raise ValueError(
            f"`bert_name_or_path` must hold a BERT checkpoint, got model_type {config.model_type!r}"
        )
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        raise ValueError(
            f"`bert_name_or_path` uses position_embedding_type={config.position_embedding_type!r}; "
            "DDCL-INCRT has absolute positions only"
        )
    return BertModel.from_pretrained(bert_name_or_path, config=config, local_files_only=local).eval()


def bert_parts(model: DDCLIncrtForSequenceClassification) -> list[nn.Module]:
    """The modules that came from BERT: the embeddings and, when present, the BERT encoder."""
    encoder = model.model
    return [encoder.embeddings] + ([encoder.bert_encoder] if encoder.bert_encoder is not None else [])


def freeze_bert_parts(model: DDCLIncrtForSequenceClassification) -> None:
    """requires_grad=False on every BERT-derived parameter (re-apply after `from_pretrained`)."""
    for part in bert_parts(model):
        part.requires_grad_(False)


def wrap_bert_embeddings(
    bert_name_or_path: str | os.PathLike,
    *,
    num_hidden_layers: int = 1,
    num_heads: int | list[int] = 1,
    num_labels: int = 2,
    use_encoder_outputs: bool = False,
    freeze: bool = True,
    **config_overrides,
) -> DDCLIncrtForSequenceClassification:
    """A DDCL-INCRT classifier on a pre-trained BERT's embeddings (docs/ddcl_incrt.md, 'BERT conversion').

    vocab_size, hidden_size, max_position_embeddings, type_vocab_size, pad_token_id, layer_norm_eps and
    initializer_range come from the BERT config; `config_overrides` set any other `DDCLIncrtConfig` field
    (head_dim, num_prototypes, pooling, ...). The embedding weights are copied, so the embedding output equals
    `BertModel.embeddings` exactly. With `use_encoder_outputs` BERT's encoder runs between the embeddings and
    the DDCL-INCRT layers (its config is stored in `bert_config`; when frozen its dropout is set to 0, so it
    is a fixed feature map). `freeze` sets requires_grad=False on every BERT-derived parameter.
    """
    for name, flag in (("use_encoder_outputs", use_encoder_outputs), ("freeze", freeze)):
        if not isinstance(flag, bool):
            raise TypeError(f"`{name}` must be a bool, got {flag!r}")
    conflicting = sorted(set(config_overrides) & {*BERT_SHAPED_FIELDS, "bert_config"})
    if conflicting:
        raise ValueError(f"{conflicting} are set by the BERT checkpoint and cannot be overridden")
    bert = load_bert(bert_name_or_path)
    bert_config = bert.config
    if bert_config.type_vocab_size < 1:
        raise ValueError(f"BERT checkpoint has type_vocab_size={bert_config.type_vocab_size}; expected >= 1")
    encoder_config = None
    if use_encoder_outputs:
        encoder_config = json.loads(bert_config.to_json_string(use_diff=False))  # as config.json stores it
        if freeze:
            encoder_config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    config = DDCLIncrtConfig(
        **{name: getattr(bert_config, name) for name in BERT_SHAPED_FIELDS},
        initializer_range=bert_config.initializer_range,
        num_hidden_layers=num_hidden_layers,
        num_heads=num_heads,
        num_labels=num_labels,
        bert_config=encoder_config,
        **config_overrides,
    )
    model = DDCLIncrtForSequenceClassification(config)
    model.model.embeddings.load_state_dict(bert.embeddings.state_dict())
    if use_encoder_outputs:
        model.model.bert_encoder.load_state_dict(bert.encoder.state_dict())
    if freeze:
        freeze_bert_parts(model)
    return model


__all__ = ["bert_parts", "freeze_bert_parts", "load_bert", "wrap_bert_embeddings"]
