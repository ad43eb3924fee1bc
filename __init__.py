"""geoformers: transformers whose structure comes from geometry (see docs in README.md)."""

from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

from geoformers.configuration.ddcl_incrt import DDCLIncrtConfig
from geoformers.modeling.ddcl_incrt import DDCLIncrtForSequenceClassification, DDCLIncrtModel

__version__ = "0.1.0"

# --- DDCL-INCRT encoder (DESIGN §3) ---
AutoConfig.register("ddcl_incrt", DDCLIncrtConfig)
AutoModel.register(DDCLIncrtConfig, DDCLIncrtModel)
AutoModelForSequenceClassification.register(DDCLIncrtConfig, DDCLIncrtForSequenceClassification)

__all__ = [
    "DDCLIncrtConfig",
    "DDCLIncrtForSequenceClassification",
    "DDCLIncrtModel",
]
