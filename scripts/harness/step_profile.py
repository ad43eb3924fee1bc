"""Where one DDL-mHC training step's time goes, grouped by mechanism (torch.profiler).

Every mechanism of the step is wrapped in a `torch.profiler.record_function` scope for the duration of
the profile (module forwards and the hyper-connection functions, patched here, never in the library).
Forward time is the self time of the ops inside each scope; backward time is attributed through the
autograd sequence number that links each backward node to the forward op that created it, so a scope's
number is its forward plus its backward. `bench_causal_lm.py --profile` prints the table.
"""

import contextlib
import statistics
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm

from geoformers.models.ddl_mhc import modeling_ddl_mhc
from geoformers.models.ddl_mhc.ops.stream_write import naive as stream_write_naive

from harness.results import markdown_table

MECHANISMS = (
    "maps projection",
    "chart",
    "read",
    "mix+write",
    "delta amplitudes",
    "attention",
    "MLP",
    "norms",
    "embedding + lm head",
    "optimizer",
    "other",
)
_BACKWARD_PREFIX = "autograd::engine::evaluate_function"


def _scoped(label: str, function):
    def wrapped(*args, **kwargs):
        with record_function(label):
            return function(*args, **kwargs)

    return wrapped


@contextlib.contextmanager
def mechanism_scopes(model: torch.nn.Module):
    """Wrap each mechanism of `model` (DDL-mHC or transformers' Llama) in a labelled profiler scope."""
    patches = [
        # n = 1: the maps without a read
        (modeling_ddl_mhc.HyperConnection, "_map_logits", "maps projection"),
        (modeling_ddl_mhc, "birkhoff", "chart"),
        # with dynamic maps also their RMS normalisation and gates
        (modeling_ddl_mhc, "read_streams", "read"),
        (modeling_ddl_mhc, "write_streams", "mix+write"),
        (stream_write_naive, "naive_delta_amplitudes", "delta amplitudes"),
        (modeling_ddl_mhc.DeltaWrite, "forward", "delta amplitudes"),
    ]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, label in patches:
        setattr(owner, name, _scoped(label, getattr(owner, name)))
    wrapped_modules = []
    for name, module in model.named_modules():
        label = None
        if name.endswith("maps_proj"):  # the maps GEMM, called before the read
            label = "maps projection"
        elif isinstance(module, LlamaAttention):
            label = "attention"
        elif isinstance(module, LlamaMLP):
            label = "MLP"
        elif isinstance(module, LlamaRMSNorm):
            label = "norms"
        elif isinstance(module, torch.nn.Embedding) or module is getattr(model, "lm_head", None):
            label = "embedding + lm head"
        if label is not None:
            module.forward = _scoped(label, module.forward)
            wrapped_modules.append(module)
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
        for module in wrapped_modules:
            del module.forward


def _scope_of(event, labels: set[str]) -> str | None:
    while event is not None:
        if event.name in labels:
            return event.name
        if event.name.startswith("Optimizer."):
            return "optimizer"
        event = event.cpu_parent
    return None


def attribute_events(events) -> dict[str, float]:
    """Microseconds per mechanism: forward self times by enclosing scope, backward nodes by the scope
    of the forward op with the same autograd sequence number."""
    labels = set(MECHANISMS)
    forward_scope = {}
    for event in events:
        if event.sequence_nr >= 0 and not event.name.startswith(_BACKWARD_PREFIX):
            scope = _scope_of(event, labels)
            if scope is not None or event.sequence_nr not in forward_scope:
                forward_scope[event.sequence_nr] = scope
    totals = defaultdict(float)
    for event in events:
        if event.name.startswith(_BACKWARD_PREFIX):
            totals[forward_scope.get(event.sequence_nr) or "other"] += event.cpu_time_total
            continue
        ancestor, in_backward = event.cpu_parent, False
        while ancestor is not None:
            if ancestor.name.startswith(_BACKWARD_PREFIX):
                in_backward = True
                break
            ancestor = ancestor.cpu_parent
        if not in_backward:
            totals[_scope_of(event, labels) or "other"] += event.self_cpu_time_total
    return dict(totals)


def _training_step(model, optimizer, batch: torch.Tensor) -> None:
    model(input_ids=batch, labels=batch).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def profile_training_steps(models: dict, batch: torch.Tensor, rounds: int = 7, steps: int = 3) -> dict:
    """Per model: the median wall time of one forward+backward+AdamW step over `rounds` round-robin rounds
    (so machine load slows every model alike) and the profiled ms per step of each mechanism over `steps`
    further steps: {name: {"step_ms": ..., "mechanisms": {mechanism: ms}}}."""
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-4) for name, model in models.items()}
    seconds = {name: [] for name in models}
    for name, model in models.items():
        model.train()
        _training_step(model, optimizers[name], batch)  # warm-up
    for _ in range(rounds):
        for name, model in models.items():
            start = time.perf_counter()
            _training_step(model, optimizers[name], batch)
            seconds[name].append(time.perf_counter() - start)
    results = {}
    for name, model in models.items():
        with mechanism_scopes(model), profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                _training_step(model, optimizers[name], batch)
        totals = attribute_events(prof.events())
        results[name] = {
            "step_ms": statistics.median(seconds[name]) * 1000,
            "mechanisms": {mechanism: totals.get(mechanism, 0.0) / steps / 1000 for mechanism in MECHANISMS},
        }
    return results


def markdown_profile(profiles: dict[str, dict]) -> str:
    """One column per profiled model: ms per step and share of the profiled total, by mechanism, and the
    interleaved median step time without the profiler (the profiler inflates op-heavy mechanisms)."""
    names = list(profiles)
    rows = []
    for mechanism in MECHANISMS:
        cells = []
        for name in names:
            times = profiles[name]["mechanisms"]
            share = times[mechanism] / max(sum(times.values()), 1e-9)
            cells.append(f"{times[mechanism]:.1f} ms ({share:.0%})")
        rows.append([mechanism, *cells])
    steps = [f"{profiles[name]['step_ms']:.1f} ms" for name in names]
    rows.append(["step (no profiler, interleaved median)", *steps])
    return markdown_table(["mechanism", *names], rows, align="l" + "r" * len(names))
