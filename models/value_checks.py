"""Where argument checks may read tensor values (docs/reliability.md, 'Arguments'): a check that reads a
value (an id range, 0/1 mask values, finiteness) copies it to the host, and on an accelerator that stalls the
stream once per check. Shape, dtype and type checks need no value and always run.

`checks_values(tensor)` decides, from the one switch `value_checks(policy)`:
"cpu" (the default) reads values of CPU tensors only; "always" reads them on every device (one host sync per
check, for debugging bad input on a GPU); "never" reads none, which is what an accelerator run does, also on
CPU. While torch.compile / torch.export trace, no value is read (a compiled model trusts its inputs, as
transformers' own checks do).
"""

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import torch

POLICIES = ("cpu", "always", "never")
_policy: ContextVar[str] = ContextVar("geoformers_value_checks", default="cpu")


@contextlib.contextmanager
def value_checks(policy: str) -> Iterator[None]:
    """Within this block the value checks follow `policy` (one of POLICIES)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    token = _policy.set(policy)
    try:
        yield
    finally:
        _policy.reset(token)


def checks_values(tensor: torch.Tensor) -> bool:
    """Whether a check may read the values of `tensor` (module docstring)."""
    if torch.compiler.is_compiling():
        return False
    policy = _policy.get()
    return policy == "always" or (policy == "cpu" and tensor.device.type == "cpu")
