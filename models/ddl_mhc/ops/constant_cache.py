"""`functools.cache` for the charts' index tables and schedules, left out while `torch.compile` traces: there
dynamo ignores a cache wrapper anyway (tracing the function itself, with a warning per call site), so the
traced graph builds the table itself and eager calls keep the cache."""

import functools

import torch


def constant_cache(function):
    """`functools.cache(function)` in eager mode; `function` itself while torch.compile / export trace."""
    cached = functools.cache(function)

    @functools.wraps(function)
    def lookup(*args):
        if torch.compiler.is_compiling():
            return function(*args)
        return cached(*args)

    return lookup
