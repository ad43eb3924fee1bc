"""Benchmark decoding (docs/serving.md, 'Decoding speed'): a random DDL-mHC causal LM against transformers'
`LlamaForCausalLM` of the same shape, in one process, interleaved (Llama, DDL-mHC, Llama, ...), at each width:

- single stream: greedy `generate` of `--new_tokens` tokens after a `--prompt_length`-token prompt, eager,
  dynamic cache (tokens per second);
- continuous batching: `generate_batch` of `--requests` requests arriving together over the paged cache
  (generated tokens per second, all requests).

With `--host_crossing` it measures instead where the hyper-connection's host path (docs/ddl_mhc.md,
'Choosing a path') stops paying: one sublayer's read and write on `--host_rows` tokens at `--host_streams`
streams, width the first of `--widths`, on the host path against the node (`ops_path("host")` /
`ops_path("node")`, interleaved), written to bench_decode_host.json.

Each rate is measured twice: per second of wall time and per second of this process's CPU time (on a machine
shared with other jobs the CPU time is the comparable number: a preempted process loses wall time, not CPU
time). Prints the medians of `--reps` repetitions and their ratios; writes them to
`--output_dir`/bench_decode.json.

    python scripts/bench_decode.py                              # widths 128 512 768, 3 reps
    python scripts/bench_decode.py --widths 512 --reps 5 --hc_streams 4 --residual add
    python scripts/bench_decode.py --host_crossing --widths 512 --reps 5
"""

import argparse
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import (
    ContinuousBatchingConfig,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
)
from transformers.utils import logging

from geoformers import DDLmHCConfig, DDLmHCForCausalLM
from geoformers.models.ddl_mhc.ops.dispatch import ops_path

from harness.flag_checks import CheckedParser, check_flag
from harness.results import REPO_ROOT, write_results
from harness.threads import DEFAULT_THREADS, THREADS_HELP, set_threads

CLOCKS = ("wall", "cpu")  # tokens per second of wall time, and of this process's CPU time


@dataclass
class BenchDecodeArguments:
    """The shapes, the decoding workload and where the report goes."""

    widths: list[int] = field(default_factory=lambda: [128, 512, 768], metadata={"help": "hidden sizes"})
    layers: int = field(default=4, metadata={"help": "decoder layers"})
    hc_streams: int = field(default=4, metadata={"help": "DDL-mHC streams n"})
    residual: str = field(default="delta", metadata={"help": "DDL-mHC residual: delta or add"})
    hc_chart: str = field(default="rtbp", metadata={"help": "DDL-mHC doubly-stochastic chart"})
    prompt_length: int = field(default=32, metadata={"help": "prompt tokens"})
    new_tokens: int = field(default=64, metadata={"help": "generated tokens per request"})
    requests: int = field(default=8, metadata={"help": "concurrent requests under continuous batching"})
    reps: int = field(default=3, metadata={"help": "repetitions (median reported)"})
    output_dir: Path = field(
        default=REPO_ROOT / "outputs" / "benchmarks", metadata={"help": "folder of bench_decode.json"}
    )
    threads: int = field(default=DEFAULT_THREADS, metadata={"help": THREADS_HELP})
    host_crossing: bool = field(
        default=False, metadata={"help": "measure one sublayer on the host path against the node instead"}
    )
    host_streams: list[int] = field(default_factory=lambda: [2, 3, 4, 8], metadata={"help": "streams n"})
    host_rows: list[int] = field(
        default_factory=lambda: [1, 2, 4, 8, 12, 16, 24, 32], metadata={"help": "tokens per call"}
    )
    host_calls: int = field(default=200, metadata={"help": "calls timed per repetition"})


def check(args: BenchDecodeArguments) -> None:
    """This script's own flag values (docs/experiments.md, 'Flags'), before any model is built."""
    for name in ("layers", "hc_streams", "prompt_length", "new_tokens", "requests", "reps", "host_calls"):
        check_flag(name, getattr(args, name), 1, integer=True)
    if not args.host_streams or min(args.host_streams) < 2:
        raise ValueError(f"--host_streams must be >= 2 (n = 1 has no host path), got {args.host_streams}")
    if not args.host_rows or min(args.host_rows) < 1:
        raise ValueError(f"--host_rows must be >= 1, got {args.host_rows}")
    if not args.widths or any(width < 64 or width % 64 for width in args.widths):
        raise ValueError(f"--widths must be multiples of 64 (64-wide heads), got {args.widths}")
    if args.residual not in ("delta", "add"):
        raise ValueError(f"--residual must be delta or add, got {args.residual!r}")


def models(args: BenchDecodeArguments, width: int) -> dict:
    """Llama and DDL-mHC of one shape (64-wide heads, 4x MLP, vocabulary 256), random, eval mode."""
    shape = dict(
        vocab_size=256,
        hidden_size=width,
        intermediate_size=4 * width,
        num_hidden_layers=args.layers,
        num_attention_heads=width // 64,
        max_position_embeddings=args.prompt_length + args.new_tokens + 8,
    )
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(**shape)).eval()
    config = DDLmHCConfig(**shape, hc_streams=args.hc_streams, residual=args.residual, hc_chart=args.hc_chart)
    return {"llama": llama, "ddl_mhc": DDLmHCForCausalLM(config).eval()}


def timed(work) -> tuple[object, float, float]:
    """`work()`'s result, wall seconds and CPU seconds of this process."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = work()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def single_stream(model, prompt: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    """Greedy tokens per wall and per CPU second of one request (every token generated: no EOS)."""
    config = GenerationConfig(
        max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0, use_cache=True
    )
    output, wall, cpu = timed(lambda: model.generate(prompt, generation_config=config))
    assert output.shape[1] == prompt.shape[1] + new_tokens
    return new_tokens / wall, new_tokens / cpu


def continuous_batching(model, prompts: list[list[int]], new_tokens: int) -> tuple[float, float]:
    """Generated tokens per wall and per CPU second of all requests, continuous batching over a paged cache
    sized to them."""
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    tokens = sum(len(prompt) for prompt in prompts) + len(prompts) * new_tokens
    paged = ContinuousBatchingConfig(num_blocks=max(16, 2 * tokens // 256 + 8), max_batch_tokens=512)
    outputs, wall, cpu = timed(
        lambda: model.generate_batch(prompts, generation_config=config, continuous_batching_config=paged)
    )
    generated = sum(len(output.generated_tokens) for output in outputs.values())
    assert generated == len(prompts) * new_tokens, generated
    return generated / wall, generated / cpu


def host_crossing(args: BenchDecodeArguments) -> None:
    """CPU microseconds of one delta sublayer's read and write (no gradient) on the host path and the node."""
    width, results = args.widths[0], []
    for n in args.host_streams:
        torch.manual_seed(0)
        config = DDLmHCConfig(
            vocab_size=256, hidden_size=width, intermediate_size=4 * width, num_hidden_layers=1,
            num_attention_heads=width // 64, hc_streams=n, residual=args.residual, hc_chart=args.hc_chart,
        )  # fmt: skip
        layer = DDLmHCForCausalLM(config).eval().model.layers[0].mlp_connection
        for rows in args.host_rows:
            streams, output = torch.randn(rows, 1, n, width), torch.randn(rows, 1, width)

            def sublayer(layer=layer, streams=streams, output=output):
                for _ in range(args.host_calls):
                    _, maps = layer.read(streams)
                    layer(streams, output, maps)

            times = {"host": [], "node": []}
            with torch.no_grad():
                for _ in range(args.reps + 1):  # the first repetition warms up
                    for path in times:
                        with ops_path(path):
                            times[path].append(timed(sublayer)[2] / args.host_calls * 1e6)
            host, node = (statistics.median(times[path][1:]) for path in ("host", "node"))
            results.append(dict(streams=n, rows=rows, host_us=host, node_us=node, ratio=node / host))
            timings = f"host {host:7.1f} us  node {node:7.1f} us  node / host {node / host:.2f}"
            print(f"n {n} rows {rows:3d}  {timings}")
    path = args.output_dir / "bench_decode_host.json"
    write_results(path, "bench_decode.py", None, asdict(args), {"sublayer": results})


def main() -> None:
    parser = CheckedParser(
        BenchDecodeArguments, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    (args,) = parser.parse_args_into_dataclasses()
    parser.checked(check, args)
    set_threads(args.threads)
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    if args.host_crossing:
        host_crossing(args)
        return
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 256, (1, args.prompt_length), generator=generator)
    lengths = torch.randint(
        args.prompt_length // 2, args.prompt_length + 1, (args.requests,), generator=generator
    )
    prompts = [torch.randint(3, 256, (int(n),), generator=generator).tolist() for n in lengths]
    rows = []
    for width in args.widths:
        pair = models(args, width)
        for model in pair.values():  # warm-up: first calls allocate and fill caches
            single_stream(model, prompt, 4)
            continuous_batching(model, prompts[:2], 4)
        modes = {"single_stream": lambda m: single_stream(m, prompt, args.new_tokens)}
        modes["continuous_batching"] = lambda m: continuous_batching(m, prompts, args.new_tokens)
        speeds = {name: {f"{mode}_{clock}": [] for mode in modes for clock in CLOCKS} for name in pair}
        for _ in range(args.reps):
            for name, model in pair.items():
                for mode, run in modes.items():
                    for clock, rate in zip(CLOCKS, run(model), strict=True):
                        speeds[name][f"{mode}_{clock}"].append(rate)
        row = {"width": width, "tokens_per_second": speeds}
        for key in speeds["llama"]:
            llama, ddl = (statistics.median(speeds[name][key]) for name in ("llama", "ddl_mhc"))
            row[f"{key}_median"] = {"llama": llama, "ddl_mhc": ddl, "ratio": ddl / llama}
            speeds_text = f"llama {llama:8.1f} tok/s  ddl_mhc {ddl:8.1f}  ratio {ddl / llama:.2f}"
            print(f"width {width:4d} {key:23s} {speeds_text}")
        rows.append(row)
    write_results(
        args.output_dir / "bench_decode.json", "bench_decode.py", None, asdict(args), {"widths": rows}
    )


if __name__ == "__main__":
    main()
