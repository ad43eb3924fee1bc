"""Scalar parameters are stored as 1-element 1-D tensors (docs/multi_process.md, 'Why no 0-d parameters'):
FSDP2's `fully_shard` shards every parameter along dim 0 and refuses 0-d ones. Checkpoints written before,
with shape (), still load: each model's `__init__` registers, when the first model is built, a
transformers weight converter for the named parameters that reshapes a stored () tensor to (1,) (saving is
unchanged), and `reshape_scalars_on_load` does the same for `nn.Module.load_state_dict`. The registration
waits for a model because it builds transformers' table of every model's conversions (about 1 s), which
`import geoformers` should not pay (docs/README.md, 'Import cost').
"""

import torch
from torch import nn
from transformers.conversion_mapping import (
    get_checkpoint_conversion_mapping,
    register_checkpoint_conversion_mapping,
)
from transformers.core_model_loading import ConversionOps, WeightConverter


class ToOneElement(ConversionOps):
    """A stored 0-d tensor -> shape (1,); any other shape passes unchanged (the reverse, used when saving, is
    the identity: new checkpoints hold the 1-D shape)."""

    def __init__(self, reshape: bool = True):
        self.reshape = reshape

    @torch.no_grad
    def convert(self, input_dict, source_patterns, target_patterns, **kwargs):
        tensor = next(iter(input_dict.values()))
        tensor = tensor[0] if isinstance(tensor, list) else tensor
        if self.reshape and tensor.ndim == 0:
            tensor = tensor.reshape(1)
        return {target_patterns[0]: tensor}

    @property
    def reverse_op(self) -> ConversionOps:
        return ToOneElement(reshape=False)


def register_one_element_parameters(model_type: str, names: tuple[str, ...]) -> None:
    """Register, once per `model_type`, the converters that load 0-d checkpoint tensors of the parameters
    whose names end in `names` into their (1,) shape."""
    if get_checkpoint_conversion_mapping(model_type) is not None:
        return
    converters = [
        WeightConverter(source_patterns=name, target_patterns=name, operations=[ToOneElement()])
        for name in names
    ]
    register_checkpoint_conversion_mapping(model_type, converters)


def reshape_scalars_on_load(module: nn.Module, names: tuple[str, ...]) -> None:
    """`module.load_state_dict` accepts a 0-d tensor for each of its (1,)-shaped parameters `names`."""

    def hook(module, state_dict, prefix, *args):
        for name in names:
            key = prefix + name
            if key in state_dict and state_dict[key].ndim == 0:
                state_dict[key] = state_dict[key].reshape(1)

    module._register_load_state_dict_pre_hook(hook, with_module=True)
