"""geoformers: transformers whose structure comes from geometry (see docs in README.md)."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

# --- DDCL-INCRT encoder (docs/ddcl_incrt.md) and DDL-mHC causal LM (docs/ddl_mhc.md) ---
from geoformers.configuration.ddcl_incrt import DDCLIncrtConfig
from geoformers.configuration.ddl_mhc import DDLmHCConfig
from geoformers.modeling.ddcl_incrt import DDCLIncrtForSequenceClassification, DDCLIncrtModel
from geoformers.modeling.ddl_mhc import DDLmHCForCausalLM, DDLmHCModel
from geoformers.modeling.hub_export import export_for_hub
from geoformers.modeling.llama_conversion import convert_llama_to_ddl_mhc

__version__ = "0.1.0"

# --- DDCL-INCRT encoder (docs/ddcl_incrt.md) ---
AutoConfig.register("ddcl_incrt", DDCLIncrtConfig)
AutoModel.register(DDCLIncrtConfig, DDCLIncrtModel)
AutoModelForSequenceClassification.register(DDCLIncrtConfig, DDCLIncrtForSequenceClassification)

# --- DDL-mHC causal LM (docs/ddl_mhc.md) ---
AutoConfig.register("ddl_mhc", DDLmHCConfig)
AutoModel.register(DDLmHCConfig, DDLmHCModel)
AutoModelForCausalLM.register(DDLmHCConfig, DDLmHCForCausalLM)

__all__ = [
    "DDCLIncrtConfig",
    "DDCLIncrtForSequenceClassification",
    "DDCLIncrtModel",
    "DDLmHCConfig",
    "DDLmHCForCausalLM",
    "DDLmHCModel",
    "convert_llama_to_ddl_mhc",
    "export_for_hub",
]
