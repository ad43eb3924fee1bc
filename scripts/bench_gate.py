"""Benchmark the INCRT gate (docs/experiments.md, 'bench_gate.py'): training-step overhead of gate checks,
tracker vs eigh.

Part 1, in one process: a small DDCL-INCRT classifier trains (forward + backward + AdamW) --max_steps steps
with `model.gate_check(batch)` every k steps, and without checks; repetitions are interleaved (round robin)
so a noisy, shared CPU slows every variant alike. Reported per k: the run-time overhead (median run time
against the median run without checks; needs a quiet machine), the time spent in checks over the time
spent in steps within the same runs (median over runs; robust to load drift between runs), and the
expected overhead t_check / (k * t_step) from the median per-check and per-step times. The target is
<= 5 % at `IncrtGrowthCallback`'s default interval `check_every` (100).

Part 2: one gate check's spectral work on A_res (hidden d x d; 2 or 8 random heads) with the trackers
(Oja + MCA EXIN with their spectral bound; cold start from a seeded vector, and warm start from a slightly
perturbed converged vector, as between checks) against the exact `eigh` reference. Prints markdown tables
and writes gate.json to `--output_dir` (default outputs/benchmarks; `--output_dir benchmarks` replaces the
committed report).

    python scripts/bench_gate.py                 # intervals 10 25 100, hidden 128..1024
    python scripts/bench_gate.py --max_steps 100 --reps 3
"""

import argparse
import itertools
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import DDCLIncrtConfig
from geoformers.models.ddcl_incrt.incrt import (
    DEFAULT_GATE_TOKENS,
    DEFAULT_TRACKER_STEPS,
    TrackedEigenpair,
    deflate,
    directional_matrix,
    exact_extreme_eigenpairs,
    interaction_matrix,
    seeded_unit_vector,
    spectral_radius_bound,
    track_eigenvector,
)
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtForSequenceClassification
from geoformers.training.growth import CADENCE_DEFAULTS

from harness.flag_checks import CheckedParser
from harness.results import write_results
from harness.threads import DEFAULT_THREADS, THREADS_HELP, set_threads

REPO_ROOT = Path(__file__).resolve().parents[1]
TARGET_OVERHEAD = 0.05


def bench_config() -> DDCLIncrtConfig:
    return DDCLIncrtConfig(
        vocab_size=2000,
        hidden_size=128,
        num_hidden_layers=2,
        num_heads=[2, 2],
        head_dim=32,
        num_prototypes=16,
        max_position_embeddings=128,
        num_labels=2,
    )


def make_batches(config: DDCLIncrtConfig, count: int, batch: int, length: int) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(count):
        input_ids = torch.randint(1, config.vocab_size, (batch, length), generator=generator)
        attention_mask = torch.ones(batch, length, dtype=torch.long)
        attention_mask[: batch // 2, length * 3 // 4 :] = 0  # half the batch right-padded
        labels = torch.randint(0, config.num_labels, (batch,), generator=generator)
        batches.append({"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels})
    return batches


def train_run(model, optimizer, batches: list[dict], check_every: int | None) -> tuple[float, list, list]:
    """Seconds for len(batches) steps; per-step and per-check seconds."""
    step_times, check_times = [], []
    start = time.perf_counter()
    for step, batch in enumerate(batches, start=1):
        tick = time.perf_counter()
        loss = model(**batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step_times.append(time.perf_counter() - tick)
        if check_every is not None and step % check_every == 0:
            tick = time.perf_counter()
            model.gate_check(batch["input_ids"], batch["attention_mask"])
            check_times.append(time.perf_counter() - tick)
    return time.perf_counter() - start, step_times, check_times


def bench_training(intervals: list[int], steps: int, reps: int, batch: int, length: int) -> dict:
    config = bench_config()
    torch.manual_seed(0)
    model = DDCLIncrtForSequenceClassification(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = make_batches(config, steps, batch, length)
    train_run(model, optimizer, batches[:20], check_every=5)  # warm-up; the gates calibrate
    variants = [None, *intervals]
    totals = {k: [] for k in variants}
    shares = {k: [] for k in intervals}
    step_times, check_times = [], []
    for _ in range(reps):
        for k in variants:
            total, steps_seconds, checks_seconds = train_run(model, optimizer, batches, k)
            totals[k].append(total)
            if k is not None:
                shares[k].append(sum(checks_seconds) / sum(steps_seconds))
            step_times += steps_seconds
            check_times += checks_seconds
    baseline = statistics.median(totals[None])
    t_step, t_check = statistics.median(step_times), statistics.median(check_times)
    rows = []
    for k in intervals:
        rows.append(
            {
                "check_every": k,
                "seconds_per_run": statistics.median(totals[k]),
                "run_time_overhead": statistics.median(totals[k]) / baseline - 1.0,
                "in_run_check_share": statistics.median(shares[k]),
                "expected_overhead": t_check / (k * t_step),
            }
        )
    return {
        "model": {
            "hidden_size": config.hidden_size,
            "num_hidden_layers": config.num_hidden_layers,
            "num_heads": config.num_heads,
            "head_dim": config.head_dim,
            "num_prototypes": config.num_prototypes,
            "batch": batch,
            "sequence_length": length,
            "gate_num_tokens": DEFAULT_GATE_TOKENS,
        },
        "steps_per_run": steps,
        "reps": reps,
        "seconds_per_run_without_checks": baseline,
        "seconds_per_step": t_step,
        "seconds_per_check": t_check,
        "default_check_every": CADENCE_DEFAULTS["check_every"],
        "intervals": rows,
    }


def spectral_problem(dim: int, num_heads: int, generator: torch.Generator) -> torch.Tensor:
    """A_res of a layer with `num_heads` random heads of width 32 (at most dim / num_heads) on 512 correlated
    tokens, two directions already deflated."""
    head_dim = min(32, dim // num_heads)
    mixing = torch.randn(dim, dim, generator=generator) / dim**0.5
    tokens = torch.randn(512, dim, generator=generator) @ (torch.eye(dim) + mixing)
    second_moment = tokens.T @ tokens / 512
    query_weights = 0.02 * torch.randn(num_heads, head_dim, dim, generator=generator)
    key_weights = 0.02 * torch.randn(num_heads, head_dim, dim, generator=generator)
    symmetric = interaction_matrix(second_moment, directional_matrix(query_weights, key_weights))
    basis = torch.linalg.qr(torch.randn(dim, 2, generator=generator))[0].T
    return deflate(symmetric, basis)


def median_seconds(function, reps: int) -> float:
    seconds = []
    for _ in range(reps):
        start = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def run_trackers(
    matrix: torch.Tensor, start_top: torch.Tensor, start_minor: torch.Tensor, config: DDCLIncrtConfig
) -> tuple[TrackedEigenpair, TrackedEigenpair]:
    """The gate's spectral work: one spectral bound, then Oja (top) and MCA EXIN (minor)."""
    tracker = {
        "max_steps": DEFAULT_TRACKER_STEPS,
        "tolerance": config.gate_tracker_tolerance,
        "spectral_bound": float(spectral_radius_bound(matrix)),
    }
    top = track_eigenvector(matrix, start_top, step=config.gate_oja_step, **tracker)
    minor = track_eigenvector(matrix, start_minor, step=config.gate_mca_step, minor=True, **tracker)
    return top, minor


def bench_spectral(dims: list[int], reps: int, config: DDCLIncrtConfig) -> list[dict]:
    generator = torch.Generator().manual_seed(1)
    rows = []
    for dim, num_heads in itertools.product(dims, (2, 8)):
        residual = spectral_problem(dim, num_heads, generator)
        cold = seeded_unit_vector(dim, seed=0)
        top, minor = run_trackers(residual, cold, cold, config)
        drift = 0.05 * torch.randn(dim, generator=generator) / dim**0.5  # the change between two checks
        warm_top, warm_minor = top.vector + drift, minor.vector - drift
        warm = run_trackers(residual, warm_top, warm_minor, config)
        exact = exact_extreme_eigenpairs(residual)
        seconds = {
            "trackers_cold": median_seconds(lambda a=residual, u=cold: run_trackers(a, u, u, config), reps),
            "trackers_warm": median_seconds(
                lambda a=residual, u=warm_top, v=warm_minor: run_trackers(a, u, v, config), reps
            ),
            "eigh": median_seconds(lambda a=residual: exact_extreme_eigenpairs(a), reps),
        }
        rows.append(
            {
                "hidden_size": dim,
                "num_heads": num_heads,
                **{f"seconds_{name}": value for name, value in seconds.items()},
                "iterations_cold": top.steps + minor.steps,
                "iterations_warm": warm[0].steps + warm[1].steps,
                "cosine_top_vs_eigh": abs(float(top.vector @ exact.top)),
                "lambda_max_relative_error": abs(top.eigenvalue - exact.lambda_max) / abs(exact.lambda_max),
                "lambda_min_relative_error": abs(minor.eigenvalue - exact.lambda_min) / abs(exact.lambda_min),
                "eigh_over_warm_trackers": seconds["eigh"] / seconds["trackers_warm"],
            }
        )
    return rows


@dataclass
class BenchGateArguments:
    """Part 1's intervals and training runs, part 2's hidden sizes, and where the report goes."""

    intervals: list[int] = field(
        default_factory=lambda: [10, 25, 100], metadata={"help": "check every k steps"}
    )
    max_steps: int = field(default=100, metadata={"help": "training steps per run"})
    reps: int = field(default=3, metadata={"help": "runs per interval (part 2: at least 5 repetitions)"})
    per_device_train_batch_size: int = field(default=16, metadata={"help": "sequences per training step"})
    length: int = field(default=64, metadata={"help": "tokens per sequence"})
    dims: list[int] = field(
        default_factory=lambda: [128, 256, 512, 1024], metadata={"help": "part 2's hidden"}
    )
    threads: int = field(default=DEFAULT_THREADS, metadata={"help": THREADS_HELP})
    output_dir: Path = field(
        default=REPO_ROOT / "outputs" / "benchmarks",
        metadata={"help": "folder of the report (benchmarks: the committed reports)"},
    )


def main() -> None:
    parser = CheckedParser(
        BenchGateArguments, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    args = parser.parse_args()
    set_threads(args.threads)

    training = bench_training(
        args.intervals, args.max_steps, args.reps, args.per_device_train_batch_size, args.length
    )
    print(
        f"\nTraining step (fwd + bwd + AdamW), {args.max_steps} steps per run, median of {args.reps} runs: "
        f"{1e3 * training['seconds_per_step']:.1f} ms/step, "
        f"{1e3 * training['seconds_per_check']:.1f} ms/check\n"
    )
    print(
        "| check every k | s per run | s per run, no checks | run-time overhead | check time / step time "
        "| expected overhead |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for row in training["intervals"]:
        default = " (default)" if row["check_every"] == training["default_check_every"] else ""
        print(
            f"| {row['check_every']}{default} | {row['seconds_per_run']:.3f} | "
            f"{training['seconds_per_run_without_checks']:.3f} | {100 * row['run_time_overhead']:+.2f} % | "
            f"{100 * row['in_run_check_share']:.2f} % | {100 * row['expected_overhead']:.2f} % |"
        )

    spectral = bench_spectral(args.dims, max(args.reps, 5), bench_config())
    print("\nSpectral work of one check (top + minor direction), median seconds\n")
    print(
        "| hidden | heads | trackers, cold | trackers, warm | eigh | eigh / warm trackers "
        "| iterations cold / warm | lambda_max rel. error | cos(u+, eigh) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in spectral:
        print(
            f"| {row['hidden_size']} | {row['num_heads']} | {row['seconds_trackers_cold']:.2e} | "
            f"{row['seconds_trackers_warm']:.2e} | {row['seconds_eigh']:.2e} | "
            f"{row['eigh_over_warm_trackers']:.1f}x | "
            f"{row['iterations_cold']} / {row['iterations_warm']} | "
            f"{row['lambda_max_relative_error']:.1e} | {row['cosine_top_vs_eigh']:.4f} |"
        )

    default_interval = training["default_check_every"]
    default_row = next((r for r in training["intervals"] if r["check_every"] == default_interval), None)
    result = {
        "benchmark": "bench_gate",
        "platform": platform.platform(),
        "processor": platform.processor(),
        "target_overhead_at_default_interval": TARGET_OVERHEAD,
        "meets_target": None
        if default_row is None
        else max(default_row["in_run_check_share"], default_row["expected_overhead"]) <= TARGET_OVERHEAD,
        "training": training,
        "spectral": spectral,
    }
    write_results(args.output_dir / "gate.json", "bench_gate.py", None, vars(args), result)


if __name__ == "__main__":
    main()
