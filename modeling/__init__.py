"""geoformers.modeling"""

from geoformers.modeling.bert_conversion import wrap_bert_embeddings
from geoformers.modeling.ddcl_incrt import (
    DDCLIncrtForSequenceClassification,
    DDCLIncrtModel,
    DDCLIncrtPreTrainedModel,
)
from geoformers.modeling.ddl_mhc import DDLmHCForCausalLM, DDLmHCModel, DDLmHCPreTrainedModel
from geoformers.modeling.llama_conversion import convert_llama_to_ddl_mhc

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
