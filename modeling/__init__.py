"""geoformers.modeling"""

from .ddcl_incrt import DDCLIncrtForSequenceClassification, DDCLIncrtModel, DDCLIncrtPreTrainedModel

__all__ = [
    "DDCLIncrtForSequenceClassification",
    "DDCLIncrtModel",
    "DDCLIncrtPreTrainedModel",
]
