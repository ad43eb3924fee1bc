"""The ops' precision plumbing (docs/ddl_mhc.md, 'Fused sublayer'), cheap on the decoding path where every
call counts: autocast switched off around their float32 arithmetic only where it is on (`torch.autocast(...,
enabled=False)` costs about 10 us to enter and leave on a CPU), and casts that skip the dispatcher when the
tensor already has the dtype."""

import contextlib

import torch


def autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """`torch.autocast(device_type, enabled=False)` where autocast is on for `device_type`, else a null
    context (the same arithmetic, nothing to switch off)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type=device_type, enabled=False)
    return contextlib.nullcontext()


def cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`tensor.to(dtype)`, without a dispatcher call when it already has that dtype."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)
