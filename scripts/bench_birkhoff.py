"""Benchmark the doubly-stochastic charts against Sinkhorn-20 (docs/experiments.md, 'bench_birkhoff.py').

For each n, a batch of matrices per method: median forward+backward seconds over --reps
repetitions, the worst doubly-stochastic violation, the logit count and the time ratio to
Sinkhorn-20, all in one process. Repetitions are interleaved across methods (round robin) so a
noisy, shared CPU slows every method alike. The chart variants (docs/chart_variants.md) get rows of their
own, timed interleaved with tbp, rtbp and Sinkhorn-20, with their time ratio to the chart they vary.
Prints markdown tables and writes `birkhoff.json` (`--rtbp_function`: `rtbp_function.json`;
`--tbp_wavefront`: `tbp_wavefront_batch<B>.json`; `--host`: `chart_host.json`) to `--output_dir` (default
outputs/benchmarks; `--output_dir benchmarks` replaces the committed report).

    python scripts/bench_birkhoff.py                       # n in 4 8 16 32, batch 8192
    python scripts/bench_birkhoff.py --sizes 4 8 --reps 9
    python scripts/bench_birkhoff.py --rtbp_function --sizes 4 8 16 --batch 1536
        # RTBP: the naive reference (naive.py) vs the one-node chart (rtbp_node.py), fwd and fwd+bwd
    python scripts/bench_birkhoff.py --tbp_wavefront --sizes 4 8 16 --batch 1536
        # TBP and STBP: the wavefront node (tbp_node.py) vs the schedule node (rtbp_node.py)
    python scripts/bench_birkhoff.py --host --sizes 4 8 --reps 101
        # decoding: `birkhoff` of 1-8 rows without a gradient, the host path vs the node
"""

import argparse
import platform
import statistics
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from geoformers.models.ddl_mhc.ops.charts import (
    CHART_VARIANTS,
    CHARTS,
    METHODS,
    MHC_LITE_MAX_N,
    birkhoff,
    ds_violation,
    num_logits,
)
from geoformers.models.ddl_mhc.ops.charts.naive import SCALED, rtbp
from geoformers.models.ddl_mhc.ops.charts.rtbp_node import schedule_node
from geoformers.models.ddl_mhc.ops.charts.tbp_node import tbp_node
from geoformers.models.ddl_mhc.ops.dispatch import ops_path

from harness.flag_checks import CheckedParser
from harness.results import markdown_table, write_results
from harness.threads import DEFAULT_THREADS, THREADS_HELP, set_threads

REPO_ROOT = Path(__file__).resolve().parents[1]
# The project's speed targets for the faster of tbp/rtbp, as a fraction of Sinkhorn-20's time
# (docs/experiments.md, 'bench_birkhoff.py').
TARGET_RATIO = {4: 0.06, 8: 0.15, 16: 0.2}


def methods_for(n: int) -> list[str]:
    """Methods that accept this n (mhc_lite: n <= MHC_LITE_MAX_N; kromhc: n a power of two), the chart
    variants left to `bench_variants`."""
    too_many_permutations = n > MHC_LITE_MAX_N
    not_power_of_two = n & (n - 1) != 0
    return [
        m
        for m in METHODS
        if not (m == "mhc_lite" and too_many_permutations)
        and not (m == "kromhc" and not_power_of_two)
        and m not in CHART_VARIANTS
    ]


def time_forward_backward(logits: torch.Tensor, upstream: torch.Tensor, n: int, method: str) -> float:
    logits.grad = None
    start = time.perf_counter()
    matrices = birkhoff(logits, n, method)
    (matrices * upstream).sum().backward()
    if logits.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def bench_size(
    n: int, batch: int, reps: int, logit_std: float, generator: torch.Generator, device: str = "cpu"
) -> list[dict]:
    methods = methods_for(n)
    upstream = torch.randn(batch, n, n, generator=generator).to(device)
    inputs = {
        m: (torch.randn(batch, num_logits(m, n), generator=generator) * logit_std).to(device).requires_grad_()
        for m in methods
    }
    violation = {m: float(ds_violation(birkhoff(inputs[m].detach(), n, m)).max()) for m in methods}
    for m in methods:  # warm-up: allocator, caches of index plans and permutation matrices
        time_forward_backward(inputs[m], upstream, n, m)
    seconds = {m: [] for m in methods}
    for _ in range(reps):
        for m in methods:
            seconds[m].append(time_forward_backward(inputs[m], upstream, n, m))
    sinkhorn = statistics.median(seconds["sinkhorn"])
    return [
        {
            "method": m,
            "n": n,
            "seconds_median": statistics.median(seconds[m]),
            "ratio_vs_sinkhorn20": statistics.median(seconds[m]) / sinkhorn,
            "max_violation": violation[m],
            "num_logits": num_logits(m, n),
        }
        for m in methods
    ]


def bench_variants(
    n: int, batch: int, reps: int, logit_std: float, generator: torch.Generator, device: str = "cpu"
) -> list[dict]:
    """Rows for the chart variants at this n: median forward+backward seconds, interleaved with the charts
    they vary (tbp, rtbp) and Sinkhorn-20, worst float32 violation, logit count, both time ratios."""
    base = {m: CHARTS[m].base for m in CHART_VARIANTS}
    methods = ["tbp", "rtbp", "sinkhorn", *base]
    upstream = torch.randn(batch, n, n, generator=generator).to(device)
    inputs = {
        m: (torch.randn(batch, num_logits(m, n), generator=generator) * logit_std).to(device).requires_grad_()
        for m in methods
    }
    for m in methods:  # warm-up
        time_forward_backward(inputs[m], upstream, n, m)
    seconds = {m: [] for m in methods}
    for _ in range(reps):
        for m in methods:
            seconds[m].append(time_forward_backward(inputs[m], upstream, n, m))
    median = {m: statistics.median(seconds[m]) for m in methods}
    return [
        {
            "method": m,
            "n": n,
            "seconds_median": median[m],
            "ratio_vs_sinkhorn20": median[m] / median["sinkhorn"],
            "varies": base[m],
            "ratio_vs_varied": median[m] / median[base[m]],
            "max_violation": float(ds_violation(birkhoff(inputs[m].detach(), n, m)).max()),
            "num_logits": num_logits(m, n),
        }
        for m in base
    ]


def interleaved_seconds(timings: dict, reps: int) -> dict:
    """key -> the seconds of `reps` calls of `timings[key]()` (each returns the seconds it measured), the keys
    in turn (round robin) after one warm-up call each (the plan cache, the allocator)."""
    for timing in timings.values():
        timing()
    seconds = {key: [] for key in timings}
    for _ in range(reps):
        for key, timing in timings.items():
            seconds[key].append(timing())
    return seconds


def bench_rtbp_function(
    n: int, batch: int, reps: int, generator: torch.Generator, device: str = "cpu"
) -> list[dict]:
    """RTBP from float32 logits, the plain-autograd reference (`naive.rtbp`, then rounded) against the
    one-node chart (`rtbp_node.rtbp_node`): median seconds of the forward (no grad) and of
    forward + backward of sum(X * G), the four timings interleaved."""
    logits = torch.randn(batch, (n - 1) ** 2, generator=generator).to(device).requires_grad_()
    upstream = torch.randn(batch, n, n, generator=generator).to(device)
    charts = {
        "rtbp autograd": lambda t: rtbp(t.double(), n).float(),
        "rtbp function": lambda t: schedule_node(t, n, "rtbp", torch.float32),
    }

    def forward(chart) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            chart(logits)
        if logits.is_cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    def forward_backward(chart) -> float:
        logits.grad = None
        start = time.perf_counter()
        (chart(logits) * upstream).sum().backward()
        if logits.is_cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    timers = {"fwd": forward, "fwd+bwd": forward_backward}
    timings = {(name, kind): partial(timers[kind], charts[name]) for kind in timers for name in charts}
    seconds = interleaved_seconds(timings, reps)
    rows = []
    for kind in timers:
        reference, function = (statistics.median(seconds[name, kind]) for name in charts)
        rows.append(
            {
                "n": n,
                "batch": batch,
                "pass": kind,
                "rtbp_autograd_seconds_median": reference,
                "rtbp_function_seconds_median": function,
                "function_vs_autograd": function / reference,
            }
        )
    return rows


def bench_tbp_wavefront(n: int, batch: int, reps: int, generator: torch.Generator) -> list[dict]:
    """TBP from float32 logits through the wavefront nodes (`TBPFunction`, `ScaledTBPFunction` for "stbp")
    against the schedule node (`chart_node`): median seconds of the forward (no grad) and of forward +
    backward of sum(X * G), all eight timings interleaved."""
    logits = torch.randn(batch, (n - 1) ** 2, generator=generator).requires_grad_()
    upstream = torch.randn(batch, n, n, generator=generator)
    charts = {
        ("tbp", "wavefront"): lambda t: tbp_node(t, n, torch.float32),
        ("tbp", "schedule"): lambda t: schedule_node(t, n, "tbp", torch.float32),
        ("stbp", "wavefront"): lambda t: tbp_node(t, n, torch.float32, SCALED),
        ("stbp", "schedule"): lambda t: schedule_node(t, n, "tbp", torch.float32, SCALED),
    }

    def forward(chart) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            chart(logits)
        return time.perf_counter() - start

    def forward_backward(chart) -> float:
        logits.grad = None
        start = time.perf_counter()
        (chart(logits) * upstream).sum().backward()
        return time.perf_counter() - start

    timers = {"fwd": forward, "fwd+bwd": forward_backward}
    timings = {(chart, kind): partial(timers[kind], charts[chart]) for kind in timers for chart in charts}
    seconds = interleaved_seconds(timings, reps)
    rows = []
    for kind in timers:
        for method in ("tbp", "stbp"):
            wavefront, schedule = (
                statistics.median(seconds[(method, node), kind]) for node in ("wavefront", "schedule")
            )
            rows.append(
                {
                    "method": method,
                    "n": n,
                    "batch": batch,
                    "pass": kind,
                    "wavefront_seconds_median": wavefront,
                    "schedule_seconds_median": schedule,
                    "schedule_vs_wavefront": schedule / wavefront,
                }
            )
    return rows


HOST_BENCH_ROWS = (1, 2, 3, 4, 8)


def run_host(args, generator: torch.Generator) -> None:
    """`birkhoff(logits, n, chart)` without a gradient on 1-8 rows of float32 logits (decoding: a token per
    sequence), the host path (`ops_path("host")`) against the node (`ops_path("node")`): median microseconds
    per call, every (chart, n, rows, path) timing interleaved; the host path's largest entry difference."""
    cases = [(m, n, r) for m in ("tbp", "rtbp") for n in args.sizes for r in HOST_BENCH_ROWS]
    logits = {(m, n, r): torch.randn(r, (n - 1) ** 2, generator=generator) for m, n, r in cases}
    paths = ("host", "node")

    def timed(case, path) -> float:
        method, n, _ = case
        with torch.no_grad(), ops_path(path):
            start = time.perf_counter()
            for _ in range(20):
                birkhoff(logits[case], n, method)
            return (time.perf_counter() - start) / 20

    timings = {(case, path): partial(timed, case, path) for case in cases for path in paths}
    seconds = interleaved_seconds(timings, args.reps)
    results = []
    for case in cases:
        method, n, rows = case
        host, node = (statistics.median(seconds[case, path]) for path in paths)
        with torch.no_grad(), ops_path("host"):
            host_matrix = birkhoff(logits[case], n, method)
        with torch.no_grad(), ops_path("node"):
            node_matrix = birkhoff(logits[case], n, method)
        results.append(
            {
                "method": method,
                "n": n,
                "rows": rows,
                "host_us_median": host * 1e6,
                "node_us_median": node * 1e6,
                "node_vs_host": node / host,
                "max_abs_difference": float((host_matrix - node_matrix).abs().max()),
            }
        )
    rows = [
        [
            r["method"],
            r["n"],
            r["rows"],
            f"{r['host_us_median']:.1f}",
            f"{r['node_us_median']:.1f}",
            f"{r['node_vs_host']:.2f}",
            f"{r['max_abs_difference']:.1e}",
        ]  # fmt: skip
        for r in results
    ]
    headers = ["chart", "n", "rows", "host us", "node us", "node / host", "max |host - node|"]
    print(markdown_table(headers, rows, align="lrrrrrr"))
    config = {
        "reps": args.reps,
        "sizes": args.sizes,
        "rows": HOST_BENCH_ROWS,
        "logits": "N(0, 1), float32, no gradient",
        "timing": "median over interleaved repetitions of the mean of 20 calls",
        **timing_environment(),
    }
    write_results(
        args.output_dir / "chart_host.json",
        "bench_birkhoff.py",
        None,
        vars(args),
        {"config": config, "results": results},
    )


def run_tbp_wavefront(args, generator: torch.Generator) -> None:
    results = []
    for n in args.sizes:
        results += bench_tbp_wavefront(n, args.batch, args.reps, generator)
    rows = [
        [
            r["method"],
            r["n"],
            r["batch"],
            r["pass"],
            f"{r['wavefront_seconds_median'] * 1e3:.3f}",
            f"{r['schedule_seconds_median'] * 1e3:.3f}",
            f"{r['schedule_vs_wavefront']:.2f}",
        ]
        for r in results
    ]
    headers = ["chart", "n", "batch", "pass", "wavefront ms", "schedule ms", "schedule / wavefront"]
    print(markdown_table(headers, rows, align="lrrlrrr"))
    config = {
        "batch": args.batch,
        "reps": args.reps,
        "sizes": args.sizes,
        "logits": "N(0, 1), float32",
        "timing": "forward (no grad) and forward + backward of sum(X * G), G ~ N(0, 1); medians over "
        "interleaved repetitions of the eight timings",
        **timing_environment(),
    }
    write_results(
        args.output_dir / f"tbp_wavefront_batch{args.batch}.json",
        "bench_birkhoff.py",
        None,
        vars(args),
        {"config": config, "results": results},
    )


def rtbp_function_table(results: list[dict]) -> str:
    rows = [
        [
            r["n"],
            r["batch"],
            r["pass"],
            f"{r['rtbp_autograd_seconds_median'] * 1e3:.3f}",
            f"{r['rtbp_function_seconds_median'] * 1e3:.3f}",
            f"{r['function_vs_autograd']:.2f}",
        ]
        for r in results
    ]
    headers = ["n", "batch", "pass", "rtbp autograd ms", "rtbp function ms", "function / autograd"]
    return markdown_table(headers, rows, align="rrlrrr")


def variants_table(rows: list[dict]) -> str:
    table = [
        [
            r["n"],
            r["method"],
            r["num_logits"],
            f"{r['seconds_median'] * 1e3:.2f}",
            f"{r['ratio_vs_sinkhorn20']:.3f}",
            f"{r['ratio_vs_varied']:.2f} ({r['varies']})",
            f"{r['max_violation']:.1e}",
        ]
        for r in rows
    ]
    headers = [
        "n",
        "variant",
        "logits",
        "fwd+bwd ms (median)",
        "x Sinkhorn-20",
        "x the chart it varies",
        "max DS violation (float32)",
    ]
    return markdown_table(headers, table, align="rlrrrrr")


def results_table(results: list[dict]) -> str:
    rows = [
        [
            r["n"],
            r["method"],
            r["num_logits"],
            f"{r['seconds_median'] * 1e3:.2f}",
            f"{r['ratio_vs_sinkhorn20']:.3f}",
            f"{r['max_violation']:.1e}",
        ]
        for r in results
    ]
    headers = ["n", "method", "logits", "fwd+bwd ms (median)", "x Sinkhorn-20", "max DS violation (float32)"]
    return markdown_table(headers, rows, align="rlrrrr")


def target_summary(results: list[dict]) -> str:
    lines = []
    for n in sorted({r["n"] for r in results}):
        exact = [r for r in results if r["n"] == n and r["method"] in ("tbp", "rtbp")]
        best = min(exact, key=lambda r: r["ratio_vs_sinkhorn20"])
        target = TARGET_RATIO.get(n)
        ratio = best["ratio_vs_sinkhorn20"]
        verdict = "no target" if target is None else ("meets" if ratio <= target else "MISSES")
        worst = max(r["max_violation"] for r in exact)
        lines.append(
            f"n={n}: fastest of tbp/rtbp is {best['method']} at {ratio:.3f}x Sinkhorn-20 "
            f"(target <= {target}x: {verdict}); worst tbp/rtbp violation {worst:.1e}"
        )
    return "\n".join(lines)


@dataclass
class BenchBirkhoffArguments:
    """The matrices timed (sizes, batch, logits), the repetitions, the device and where the report goes."""

    sizes: list[int] = field(
        default_factory=lambda: [4, 8, 16, 32], metadata={"help": "n of the n x n charts"}
    )
    batch: int = field(default=8192, metadata={"help": "matrices per timed call"})
    reps: int = field(default=7, metadata={"help": "interleaved repetitions (medians; at least 5)"})
    logit_std: float = field(default=1.0, metadata={"help": "logits ~ N(0, std^2)"})
    seed: int = 0
    device: str = field(default="cpu", metadata={"help": "cpu or cuda (CUDA tensors take the Triton charts)"})
    threads: int = field(default=DEFAULT_THREADS, metadata={"help": THREADS_HELP})
    output_dir: Path = field(
        default=REPO_ROOT / "outputs" / "benchmarks",
        metadata={"help": "folder of the report (benchmarks: the committed reports)"},
    )
    rtbp_function: bool = field(
        default=False,
        metadata={"help": "only RTBP autograd reference vs one-node chart (rtbp_function.json)"},
    )
    tbp_wavefront: bool = field(
        default=False,
        metadata={"help": "only TBP's wavefront nodes vs the schedule node (tbp_wavefront_batch<B>.json)"},
    )
    host: bool = field(
        default=False,
        metadata={"help": "only decoding's charts of 1-8 rows: the host path vs the node (chart_host.json)"},
    )


def main() -> None:
    parser = CheckedParser(
        BenchBirkhoffArguments, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    args = parser.parse_args()
    if args.reps < 5:
        parser.error("--reps must be >= 5 (medians of at least five repetitions)")

    set_threads(args.threads)
    generator = torch.Generator().manual_seed(args.seed)
    if args.rtbp_function:
        run_rtbp_function(args, generator)
        return
    if args.tbp_wavefront:
        run_tbp_wavefront(args, generator)
        return
    if args.host:
        run_host(args, generator)
        return
    results = []
    for n in args.sizes:
        results += bench_size(n, args.batch, args.reps, args.logit_std, generator, args.device)
    variants = []
    for n in args.sizes:
        variants += bench_variants(n, args.batch, args.reps, args.logit_std, generator, args.device)
    print(results_table(results))
    print()
    print(target_summary(results))
    print()
    print(variants_table(variants))

    config = {
        "batch": args.batch,
        "reps": args.reps,
        "sizes": args.sizes,
        "logits": f"N(0, {args.logit_std}^2)",
        "timing": "forward + backward of sum(X * G), G ~ N(0, 1); median over interleaved repetitions",
        **timing_environment(),
    }
    report = {"config": config, "results": results, "variants": variants}
    write_results(args.output_dir / "birkhoff.json", "bench_birkhoff.py", None, vars(args), report)


def timing_environment() -> dict:
    """What a timing depends on besides its arguments: torch, its threads and the processor."""
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
    }


def run_rtbp_function(args, generator: torch.Generator) -> None:
    results = []
    for n in args.sizes:
        results += bench_rtbp_function(n, args.batch, args.reps, generator, args.device)
    print(rtbp_function_table(results))
    config = {
        "batch": args.batch,
        "reps": args.reps,
        "sizes": args.sizes,
        "logits": "N(0, 1), float32",
        "timing": "forward (no grad) and forward + backward of sum(X * G), G ~ N(0, 1); medians over "
        "interleaved repetitions of the four timings",
        **timing_environment(),
    }
    write_results(
        args.output_dir / "rtbp_function.json",
        "bench_birkhoff.py",
        None,
        vars(args),
        {"config": config, "results": results},
    )


if __name__ == "__main__":
    main()
