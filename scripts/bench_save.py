"""Benchmark `save_pretrained` (docs/reliability.md, 'Cost of a save'): a DDL-mHC causal LM upcycled from a
random Llama of SmolLM2-135M's shape (float32) against transformers' own `LlamaForCausalLM.save_pretrained`
of that Llama, in one process, interleaved (Llama, DDL-mHC, Llama, ...), each save into a fresh folder.
Prints the median seconds of each and their ratio, and writes them to `--output_dir`/bench_save.json.

    python scripts/bench_save.py                       # 3 repetitions, outputs/benchmarks/bench_save.json
    python scripts/bench_save.py --reps 5 --hc_streams 4 --output_dir outputs/save
"""

import argparse
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import logging

from geoformers.models.ddl_mhc.llama_conversion import convert_llama_to_ddl_mhc

from harness.flag_checks import CheckedParser
from harness.results import REPO_ROOT, write_results
from harness.threads import DEFAULT_THREADS, THREADS_HELP, set_threads

# SmolLM2-135M's decoder shape (about 135 M parameters with tied embeddings).
SMOLLM2_135M = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}


def timed_save(model, folder: Path) -> float:
    start = time.perf_counter()
    model.save_pretrained(folder)
    seconds = time.perf_counter() - start
    shutil.rmtree(folder)
    return seconds


@dataclass
class BenchSaveArguments:
    """The repetitions, the upcycled model's streams and where the saves and the report go."""

    reps: int = field(default=3, metadata={"help": "repetitions of each save (median reported)"})
    hc_streams: int = field(default=4, metadata={"help": "streams of the upcycled DDL-mHC"})
    work_dir: Path | None = field(default=None, metadata={"help": "folder of the saves (default: temp)"})
    output_dir: Path = field(
        default=REPO_ROOT / "outputs" / "benchmarks", metadata={"help": "folder of the report"}
    )
    threads: int = field(default=DEFAULT_THREADS, metadata={"help": THREADS_HELP})


def main() -> None:
    parser = CheckedParser(
        BenchSaveArguments, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    args = parser.parse_args()
    set_threads(args.threads)
    if args.reps < 1:
        parser.error("--reps must be >= 1")
    logging.disable_progress_bar()
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).eval()
    ddl_mhc = convert_llama_to_ddl_mhc(llama, hc_streams=args.hc_streams).eval()
    work_dir = Path(tempfile.mkdtemp(dir=args.work_dir))
    seconds = {"llama": [], "ddl_mhc": []}
    try:
        for rep in range(args.reps):
            seconds["llama"].append(timed_save(llama, work_dir / f"llama-{rep}"))
            seconds["ddl_mhc"].append(timed_save(ddl_mhc, work_dir / f"ddl_mhc-{rep}"))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    result = {
        "parameters": {"llama": llama.num_parameters(), "ddl_mhc": ddl_mhc.num_parameters()},
        "seconds": seconds,
        "median_seconds": medians,
        "ratio": medians["ddl_mhc"] / medians["llama"],
        "shape": {"dtype": "float32", **SMOLLM2_135M},
    }
    print(
        f"LlamaForCausalLM.save_pretrained ({result['parameters']['llama']:,} parameters): "
        f"median {medians['llama']:.3f} s"
    )
    print(
        f"DDLmHCForCausalLM.save_pretrained ({result['parameters']['ddl_mhc']:,} parameters): "
        f"median {medians['ddl_mhc']:.3f} s"
    )
    print(f"ratio DDL-mHC / Llama: {result['ratio']:.2f}")
    write_results(args.output_dir / "bench_save.json", "bench_save.py", None, vars(args), result)


if __name__ == "__main__":
    main()
