"""geoformers: transformers whose structure comes from geometry (see docs in README.md).

`import geoformers` loads the two configs and models (the Auto registration needs the classes) and nothing
else; the conversion and export helpers and the `training` / `tokenization` packages load on first use
(PEP 562 module `__getattr__`; docs/README.md, 'Import cost').
"""

import importlib
from typing import TYPE_CHECKING

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

# first: a transformers release outside the supported range fails here, naming both (docs/versions.md)
from geoformers.models.transformers_range import TRANSFORMERS_REQUIREMENT  # noqa: F401

# isort: split

# --- DDCL-INCRT encoder (docs/ddcl_incrt.md) and DDL-mHC causal LM (docs/ddl_mhc.md) ---
from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import DDCLIncrtConfig
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import (
    DDCLIncrtForSequenceClassification,
    DDCLIncrtModel,
)
from geoformers.models.ddl_mhc.configuration_ddl_mhc import DDLmHCConfig
from geoformers.models.ddl_mhc.modeling_ddl_mhc import DDLmHCForCausalLM, DDLmHCModel

if TYPE_CHECKING:
    from geoformers.model_io.hub_export import export_for_hub
    from geoformers.models.ddl_mhc.llama_conversion import convert_llama_to_ddl_mhc, load_llama

__version__ = "0.1.0"

# --- DDCL-INCRT encoder (docs/ddcl_incrt.md) ---
AutoConfig.register("ddcl_incrt", DDCLIncrtConfig)
AutoModel.register(DDCLIncrtConfig, DDCLIncrtModel)
AutoModelForSequenceClassification.register(DDCLIncrtConfig, DDCLIncrtForSequenceClassification)

# --- DDL-mHC causal LM (docs/ddl_mhc.md) ---
AutoConfig.register("ddl_mhc", DDLmHCConfig)
AutoModel.register(DDLmHCConfig, DDLmHCModel)
AutoModelForCausalLM.register(DDLmHCConfig, DDLmHCForCausalLM)

# name -> the module that defines it, imported on first access
_LAZY = {
    "convert_llama_to_ddl_mhc": "geoformers.models.ddl_mhc.llama_conversion",
    "load_llama": "geoformers.models.ddl_mhc.llama_conversion",
    "export_for_hub": "geoformers.model_io.hub_export",
}
_SUBPACKAGES = ("tokenization", "training")


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *_SUBPACKAGES})


__all__ = [
    "DDCLIncrtConfig",
    "DDCLIncrtForSequenceClassification",
    "DDCLIncrtModel",
    "DDLmHCConfig",
    "DDLmHCForCausalLM",
    "DDLmHCModel",
    "convert_llama_to_ddl_mhc",
    "export_for_hub",
    "load_llama",
]
