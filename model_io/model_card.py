"""Model cards generated from the model being exported: its own config, its parameter count and only the
metrics measured on it (passed in by the caller; none by default).

The cards in `model_cards/` describe the project's benchmark runs; an exported model is usually another
configuration, so its card is written from the model itself (a `huggingface_hub.ModelCard`).
"""

import math
from collections.abc import Mapping

from huggingface_hub import ModelCard, ModelCardData

from geoformers.model_io.remote_code import TASK_AUTO_CLASSES
from geoformers.models.transformers_range import TRANSFORMERS_REQUIREMENT

# Per model type: title, pipeline tag, one-line description and the config fields shown (field, meaning).
_CARD_FACTS = {
    "ddl_mhc": (
        "DDL-mHC causal language model",
        "text-generation",
        "A causal LM whose residual update is the Deep Delta rule over `hc_streams` hyper-connection streams "
        "mixed by an exactly doubly-stochastic matrix (the `hc_chart`).",
        (
            ("num_hidden_layers", "layers"),
            ("hidden_size", "width"),
            ("intermediate_size", "MLP width"),
            ("num_attention_heads", "attention heads"),
            ("num_key_value_heads", "key/value heads"),
            ("hc_streams", "hyper-connection streams n"),
            ("hc_chart", "doubly-stochastic chart"),
            ("residual", "residual update"),
            ("stream_expansion", "stream expansion"),
            ("vocab_size", "vocabulary size"),
            ("max_position_embeddings", "context length"),
        ),
    ),
    "ddcl_incrt": (
        "DDCL-INCRT encoder",
        "text-classification",
        "An encoder whose layers grow attention heads while a spectral gate exceeds its threshold; each head "
        "reads through a bank of prototypes with learnable temperatures.",
        (
            ("num_hidden_layers", "layers"),
            ("hidden_size", "width"),
            ("num_heads", "attention heads per layer"),
            ("head_dim", "head width"),
            ("max_heads", "most heads per layer"),
            ("num_prototypes", "prototypes per head"),
            ("pooling", "pooling"),
            ("num_labels", "labels"),
            ("vocab_size", "vocabulary size"),
            ("max_position_embeddings", "context length"),
        ),
    ),
}


def _checked_metrics(metrics) -> dict[str, float]:
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a mapping of metric name to number, got {type(metrics).__name__}")
    checked = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"metrics: every name must be a non-empty str, got {name!r}")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"metrics[{name!r}] must be a finite number, got {value!r}")
        checked[name] = value
    return checked


def model_card(model, metrics: Mapping[str, float] | None = None) -> ModelCard:
    """The card of `model` (a geoformers model): architecture, the config fields that shape it, the
    parameter count, the auto classes to load it with, and `metrics` (name -> value) measured on it."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in _CARD_FACTS:
        raise TypeError(f"model_card expects a geoformers model, got {type(model).__name__}")
    measured = _checked_metrics(metrics)
    title, pipeline_tag, description, fields = _CARD_FACTS[model_type]
    name = type(model).__name__
    data = ModelCardData(
        library_name="transformers", pipeline_tag=pipeline_tag, tags=["geoformers", model_type, "custom_code"]
    )
    rows = [
        f"| `{field}` ({meaning}) | {getattr(config, field)} |"
        for field, meaning in fields
        if getattr(config, field, None) is not None
    ]
    lines = [
        "---",
        data.to_yaml(),
        "---",
        "",
        f"# {title}: `{name}`",
        "",
        description,
        "",
        "## This model",
        "",
        "| config field | value |",
        "|---|---|",
        *rows,
        f"| parameters | {model.num_parameters():,} |",
        "",
        "## Evaluation",
        "",
    ]
    if measured:
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {metric} | {value:.6g} |" for metric, value in measured.items()]
    else:
        lines.append("No evaluation results were recorded for this model.")
    auto_class = next(
        (auto for suffix, auto in TASK_AUTO_CLASSES.items() if name.endswith(suffix)), "AutoModel"
    )
    lines += [
        "",
        "## Use",
        "",
        "The modelling code ships in this repository (`configuration_*.py`, `modeling_*.py`); `geoformers` "
        f"need not be installed. The code supports `{TRANSFORMERS_REQUIREMENT}` and says so when loaded "
        "under another transformers:",
        "",
        "```python",
        f"from transformers import {auto_class}",
        f'model = {auto_class}.from_pretrained("<this repository>", trust_remote_code=True)',
        "```",
        "",
    ]
    return ModelCard("\n".join(lines))
