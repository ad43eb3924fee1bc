"""geoformers.models: one home per model (`ddl_mhc/`, `ddcl_incrt/`: configuration, modeling, ops and
converter together) and the pieces both models' forward uses (input and value checks, config validation, the
transformers range). The names below load on first access (PEP 562), so importing one model file does not
import the conversions (docs/README.md, 'Import cost')."""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from geoformers.models.ddcl_incrt.bert_conversion import wrap_bert_embeddings
    from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import DDCLIncrtConfig
    from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import (
        DDCLIncrtForSequenceClassification,
        DDCLIncrtModel,
        DDCLIncrtPreTrainedModel,
    )
    from geoformers.models.ddl_mhc.configuration_ddl_mhc import DDLmHCConfig
    from geoformers.models.ddl_mhc.llama_conversion import convert_llama_to_ddl_mhc, load_llama
    from geoformers.models.ddl_mhc.modeling_ddl_mhc import (
        DDLmHCForCausalLM,
        DDLmHCModel,
        DDLmHCPreTrainedModel,
    )

# name -> the module that defines it
_LAZY = {
    "DDCLIncrtConfig": "geoformers.models.ddcl_incrt.configuration_ddcl_incrt",
    "DDCLIncrtForSequenceClassification": "geoformers.models.ddcl_incrt.modeling_ddcl_incrt",
    "DDCLIncrtModel": "geoformers.models.ddcl_incrt.modeling_ddcl_incrt",
    "DDCLIncrtPreTrainedModel": "geoformers.models.ddcl_incrt.modeling_ddcl_incrt",
    "DDLmHCConfig": "geoformers.models.ddl_mhc.configuration_ddl_mhc",
    "DDLmHCForCausalLM": "geoformers.models.ddl_mhc.modeling_ddl_mhc",
    "DDLmHCModel": "geoformers.models.ddl_mhc.modeling_ddl_mhc",
    "DDLmHCPreTrainedModel": "geoformers.models.ddl_mhc.modeling_ddl_mhc",
    "convert_llama_to_ddl_mhc": "geoformers.models.ddl_mhc.llama_conversion",
    "load_llama": "geoformers.models.ddl_mhc.llama_conversion",
    "wrap_bert_embeddings": "geoformers.models.ddcl_incrt.bert_conversion",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "DDCLIncrtConfig",
    "DDCLIncrtForSequenceClassification",
    "DDCLIncrtModel",
    "DDCLIncrtPreTrainedModel",
    "DDLmHCConfig",
    "DDLmHCForCausalLM",
    "DDLmHCModel",
    "DDLmHCPreTrainedModel",
    "convert_llama_to_ddl_mhc",
    "load_llama",
    "wrap_bert_embeddings",
]
