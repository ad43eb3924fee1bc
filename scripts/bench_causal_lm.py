"""Benchmark DDL-mHC against transformers' LlamaForCausalLM (issue 3, DESIGN §2), all in one process.

Same shape for every model: nanoGPT's small CPU config (4 layers, 4 heads, width 128, block 64, batch 12,
character-level tiny-shakespeare, SwiGLU width 344), the same batches, AdamW lr 1e-3 with warm-up and
cosine decay (`train_causal_lm.py`'s loop). Models: Llama, then geoformers with (n=1, add) = the Llama
ablation, (n=1, delta) = DDL with d_v = 1, (n=4, add, sinkhorn) = mHC, (n=4, add, rtbp), (n=4, delta, rtbp).

Training runs round robin (one step of every model in turn), and so do the generation repetitions, so a
noisy, shared machine slows all models alike. For each model: training tokens/s (median step time over
the run, and its ratio to Llama), generation tokens/s with the KV cache (greedy, batch 1, median of
`--gen_reps`), peak training memory (CUDA: peak allocated; CPU: parameters + gradients + AdamW state +
the activations autograd saves for one step, counted once per storage), parameter count, and validation
loss after `--steps` steps (nanoGPT: 2,000). `--compile` trains every model, Llama included, through
`torch.compile` (generation stays eager). Prints a markdown table and writes benchmarks/causal_lm.json.

    python scripts/bench_causal_lm.py                  # 2,000 steps per model (about an hour on a CPU)
    python scripts/bench_causal_lm.py --steps 50       # quick check that everything runs
    python scripts/bench_causal_lm.py --steps 200 --compile  # every model through torch.compile
"""

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_causal_lm import (  # noqa: E402
    SMALL_CPU_SHAPE,
    add_training_arguments,
    estimate_loss,
    get_batch,
    load_corpus,
    make_trainer,
)

import geoformers  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "llama (transformers)": None,
    "ddl-mhc n=1 add": {"hc_streams": 1, "residual": "add"},
    "ddl-mhc n=1 delta": {"hc_streams": 1, "residual": "delta"},
    "ddl-mhc n=4 add sinkhorn": {"hc_streams": 4, "residual": "add", "hc_chart": "sinkhorn"},
    "ddl-mhc n=4 add rtbp": {"hc_streams": 4, "residual": "add", "hc_chart": "rtbp"},
    "ddl-mhc n=4 delta rtbp": {"hc_streams": 4, "residual": "delta", "hc_chart": "rtbp"},
}
# Issue 3's targets for the n = 4 delta model: >= 0.8x Llama's training throughput, lower validation loss.
TARGET_THROUGHPUT_RATIO = 0.8


def build_model(variant: dict | None, tokenizer, max_positions: int):
    shape = dict(
        SMALL_CPU_SHAPE,
        vocab_size=len(tokenizer),
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    if variant is None:
        return LlamaForCausalLM(LlamaConfig(**shape))
    return geoformers.DDLmHCForCausalLM(geoformers.DDLmHCConfig(**shape, **variant))


def training_memory_bytes(model, batch: torch.Tensor, device: torch.device) -> int:
    """Peak training memory of one step: measured on CUDA; on CPU, parameters + gradients + two AdamW
    moments + the tensors autograd saves for backward (counted once per storage)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        model(input_ids=batch, labels=batch).loss.backward()
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated(device)
    saved = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    parameter_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    activations = sum(nbytes for ptr, nbytes in saved.items() if ptr not in parameter_ptrs)
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    return 4 * parameters + activations


@torch.no_grad()
def generation_seconds(model, tokenizer, new_tokens: int, device) -> float:
    """Wall seconds to generate `new_tokens` greedy tokens after one BOS token, with the KV cache."""
    prompt = torch.tensor([[tokenizer.bos_token_id]], device=device)
    start = time.perf_counter()
    model.generate(
        prompt,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        use_cache=True,
        pad_token_id=tokenizer.pad_token_id,
    )
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def markdown_table(rows: list[dict]) -> str:
    lines = [
        "| model | params | train tok/s | ratio to Llama | gen tok/s (cache) | peak mem (MiB) | val loss |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['model']} | {row['parameters']:,} | {row['train_tokens_per_second']:,.0f} | "
            f"{row['train_throughput_ratio']:.2f} | {row['generation_tokens_per_second']:,.0f} | "
            f"{row['peak_memory_bytes'] / 2**20:.1f} | {row['val_loss']:.4f} |"
        )
    return "\n".join(lines)


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    add_training_arguments(parser, steps=2000)
    parser.add_argument("--gen_tokens", type=int, default=200)
    parser.add_argument("--gen_reps", type=int, default=3)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--output", default=str(REPO_ROOT / "benchmarks" / "causal_lm.json"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    tokenizer, train_ids, val_ids = load_corpus(args.data)
    generator = torch.Generator().manual_seed(0)
    probe = get_batch(train_ids, args.batch_size, args.block_size, generator).to(device)

    # Round robin: one step of every model in turn, so a noisy, shared machine slows them alike.
    models, trainers, seconds, memory = {}, {}, {}, {}
    for name in args.variants:
        torch.manual_seed(args.seed)
        max_positions = max(args.block_size, args.gen_tokens + 1)  # RoPE: no weights depend on it
        models[name] = build_model(VARIANTS[name], tokenizer, max_positions).to(device)
        memory[name] = training_memory_bytes(models[name], probe, device)
        trainers[name] = make_trainer(models[name], train_ids, args, device)
        seconds[name] = []
    for step in range(args.steps):
        for name in args.variants:
            seconds[name].append(trainers[name]()[1])
        if (step + 1) % max(1, args.steps // 10) == 0:
            print(f"step {step + 1}/{args.steps}", flush=True)

    generation = {name: [] for name in args.variants}
    for model in models.values():
        model.eval()
    for _ in range(args.gen_reps):
        for name, model in models.items():
            generation[name].append(generation_seconds(model, tokenizer, args.gen_tokens, device))

    rows = []
    tokens_per_step = args.batch_size * args.block_size
    for name, model in models.items():
        val_loss = estimate_loss(
            model, val_ids, args.batch_size, args.block_size, args.eval_batches, 0, device
        )
        row = {
            "model": name,
            "config": VARIANTS[name],
            "parameters": model.num_parameters(),
            "train_tokens_per_second": tokens_per_step / statistics.median(seconds[name]),
            "generation_tokens_per_second": args.gen_tokens / statistics.median(generation[name]),
            "peak_memory_bytes": memory[name],
            "val_loss": val_loss,
            "train_seconds": sum(seconds[name]),
            "first_step_seconds": seconds[name][0],  # with --compile: the compilation
        }
        rows.append(row)
        print(f"{name}: val loss {val_loss:.4f}, {row['train_tokens_per_second']:,.0f} tok/s", flush=True)

    llama = next((row for row in rows if VARIANTS[row["model"]] is None), rows[0])
    for row in rows:
        row["train_throughput_ratio"] = row["train_tokens_per_second"] / llama["train_tokens_per_second"]
    table = markdown_table(rows)
    print()
    print(f"{args.steps} steps, batch {args.batch_size} x block {args.block_size}, device {device}")
    print(table)

    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    settings = {key: value for key, value in vars(args).items() if key not in ("output", "variants")}
    report = {
        "command": "python scripts/bench_causal_lm.py " + " ".join(sys.argv[1:]),
        "settings": settings,
        "shape": SMALL_CPU_SHAPE,
        "machine": {
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "target_throughput_ratio": TARGET_THROUGHPUT_RATIO,
        "results": rows,
        "markdown": table,
    }
    output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
