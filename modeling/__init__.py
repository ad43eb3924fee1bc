"""geoformers.modeling"""

from .bert_conversion import wrap_bert_embeddings
from .ddcl_incrt import DDCLIncrtForSequenceClassification, DDCLIncrtModel, DDCLIncrtPreTrainedModel
from .ddl_mhc import DDLmHCForCausalLM, DDLmHCModel, DDLmHCPreTrainedModel
from .llama_conversion import convert_llama_to_ddl_mhc

__all__ = [
    "DDCLIncrtForSequenceClassification",
    "DDCLIncrtModel",
    "DDCLIncrtPreTrainedModel",
    "DDLmHCForCausalLM",
    "DDLmHCModel",
    "DDLmHCPreTrainedModel",
    "convert_llama_to_ddl_mhc",
    "wrap_bert_embeddings",
]
