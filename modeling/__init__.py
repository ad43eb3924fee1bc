"""geoformers.modeling: the models, their building blocks, conversions and Hub export. The names below load
on first access (PEP 562), so importing one model file does not import the conversions."""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from geoformers.modeling.bert_conversion import wrap_bert_embeddings
    from geoformers.modeling.ddcl_incrt import (
        DDCLIncrtForSequenceClassification,
        DDCLIncrtModel,
        DDCLIncrtPreTrainedModel,
    )
    from geoformers.modeling.ddl_mhc import DDLmHCForCausalLM, DDLmHCModel, DDLmHCPreTrainedModel
    from geoformers.modeling.llama_conversion import convert_llama_to_ddl_mhc, load_llama

# name -> the module that defines it
_LAZY = {
    "DDCLIncrtForSequenceClassification": "geoformers.modeling.ddcl_incrt",
    "DDCLIncrtModel": "geoformers.modeling.ddcl_incrt",
    "DDCLIncrtPreTrainedModel": "geoformers.modeling.ddcl_incrt",
    "DDLmHCForCausalLM": "geoformers.modeling.ddl_mhc",
    "DDLmHCModel": "geoformers.modeling.ddl_mhc",
    "DDLmHCPreTrainedModel": "geoformers.modeling.ddl_mhc",
    "convert_llama_to_ddl_mhc": "geoformers.modeling.llama_conversion",
    "load_llama": "geoformers.modeling.llama_conversion",
    "wrap_bert_embeddings": "geoformers.modeling.bert_conversion",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "DDCLIncrtForSequenceClassification",
    "DDCLIncrtModel",
    "DDCLIncrtPreTrainedModel",
    "DDLmHCForCausalLM",
    "DDLmHCModel",
    "DDLmHCPreTrainedModel",
    "convert_llama_to_ddl_mhc",
    "load_llama",
    "wrap_bert_embeddings",
]
