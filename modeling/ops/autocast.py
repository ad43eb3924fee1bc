"""Autocast switched off around the ops' float32 arithmetic (docs/ddl_mhc.md, 'Fused sublayer'), entered only
where autocast is on: `torch.autocast(..., enabled=False)` costs about 10 us to enter and leave on a CPU, a
tenth of a decoding step's stream update."""

import contextlib

import torch


def autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """`torch.autocast(device_type, enabled=False)` where autocast is on for `device_type`, else a null
    context (the same arithmetic, nothing to switch off)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type=device_type, enabled=False)
    return contextlib.nullcontext()
