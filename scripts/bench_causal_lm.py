"""Benchmark DDL-mHC against transformers' LlamaForCausalLM of the same shape, all in one process.

Every model of a run sees the same batches of character-level tiny-shakespeare, AdamW lr 1e-3 with warm-up
and cosine decay, each through its own `Trainer` (`harness.causal_lm.build_trainer`, docs/experiments.md,
'Shared causal-LM recipe'). Training runs round robin (one step of every model in turn,
`harness.round_robin`) and so do the decode repetitions, so a noisy, shared machine slows all models alike;
times are medians. The default shape is nanoGPT's small CPU config (4 layers, 4 heads, width 128, block 64,
batch 12).

    python scripts/bench_causal_lm.py --max_steps 200        # the variant table
    python scripts/bench_causal_lm.py --profile              # where an n=4 step's time goes, widths 128 / 512
    python scripts/bench_causal_lm.py --sweep                # widths 128/256/512, n=1/4 and the peer mHC
    python scripts/bench_causal_lm.py --sweep --torch_compile  # the same, torch.compile (+ static cache)
    python scripts/bench_causal_lm.py --equal_time --seeds 0 1 2   # the wall time of Llama's 2,000 steps
    python scripts/bench_causal_lm.py --bf16 --sweep --widths 768 --layers 12   # GPU

Modes write causal_lm{,_profile,_sweep,_equal_time}.json to `--output_dir` (default outputs/benchmarks;
`--output_dir benchmarks` replaces the committed files). Peak memory:
CUDA's peak allocated; on CPU parameters + gradients + AdamW state + the tensors autograd saves for one
step (counted once per storage).
"""

import copy
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import CompileConfig, LlamaConfig, LlamaForCausalLM

import geoformers

from harness.causal_lm import (
    EQUAL_TIME_VARIANTS,
    GPU_SWEEP_VARIANTS,
    LLAMA,
    PEER,
    SMALL_CPU_SHAPE,
    SWEEP_VARIANTS,
    VARIANTS,
    build_model,
    build_trainer,
    estimate_loss,
    get_batch,
    interleaved_step_seconds,
    load_corpus,
    on_ops_path,
    run_settings,
    shape_for,
    train_trainers_round_robin,
    training_memory_bytes,
)
from harness.flags import training_arguments
from harness.lm_trainer import lm_parser
from harness.results import markdown_table, write_results
from harness.step_profile import markdown_profile, profile_training_steps
from harness.threads import set_threads

REPO_ROOT = Path(__file__).resolve().parents[1]
# Targets for the n = 4 delta model (default chart): training throughput relative to Llama of the same shape.
TARGETS = {
    "train eager, width 128": 0.7,
    "train compiled, width 128": 0.8,
    "train compiled, width 512": 0.9,
    "decode eager": 0.5,
    "decode static cache + compile": 0.7,
}


def parameter_matched_intermediate(tokenizer, max_positions: int, shape: dict, target: int) -> int:
    """The Llama `intermediate_size` whose parameter count is closest to `target` (it is linear in it)."""
    sizes = [shape["intermediate_size"], shape["intermediate_size"] + 64]
    counts = [build_model(LLAMA, tokenizer, max_positions, shape, size).num_parameters() for size in sizes]
    per_unit = (counts[1] - counts[0]) / (sizes[1] - sizes[0])
    return max(1, round(sizes[0] + (target - counts[0]) / per_unit))


@torch.no_grad()
def generation_seconds(model, tokenizer, new_tokens: int, device, static: bool, compiled: bool) -> float:
    """Wall seconds for `new_tokens` greedy tokens after one BOS token with the KV cache (`static`:
    transformers' StaticCache; `compiled`: its forward through torch.compile, fullgraph)."""
    prompt = torch.tensor([[tokenizer.bos_token_id]], device=device)
    options = {}
    if static:
        options["cache_implementation"] = "static"
    if compiled:
        config = CompileConfig(fullgraph=True, dynamic=False)
        config._compile_all_devices = True  # transformers auto-compiles on accelerators only
        options["compile_config"] = config
    start = time.perf_counter()
    model.generate(
        prompt,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        use_cache=True,
        pad_token_id=tokenizer.pad_token_id,
        **options,
    )
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(
    names, tokenizer, train_ids, val_ids, args, device, shape: dict, decode: bool = True
) -> list[dict]:
    """Train `names` round robin for args.max_steps at `shape`, then decode round robin; one row per model."""
    generator = torch.Generator().manual_seed(0)
    probe = get_batch(train_ids, args.per_device_train_batch_size, args.block_size, generator).to(device)
    max_positions = max(args.block_size, args.gen_tokens + 1)  # RoPE: no weights depend on it
    models, trainers, memory = {}, {}, {}
    for name in names:
        torch.manual_seed(args.seed)
        models[name] = build_model(name, tokenizer, max_positions, shape).to(device)
        memory[name] = training_memory_bytes(models[name], probe, device)
        trainers[name] = build_trainer(models[name], train_ids, args)
    run = train_trainers_round_robin(trainers)
    generation = {name: [] for name in names}
    for model in models.values():
        model.eval()
    can_decode = [name for name in names if decode and hasattr(models[name], "generate")]
    for _ in range(args.gen_reps):
        for name in can_decode:
            seconds = generation_seconds(
                models[name],
                tokenizer,
                args.gen_tokens,
                device,
                static=args.torch_compile,
                compiled=args.torch_compile,
            )
            generation[name].append(seconds)
    rows = []
    tokens_per_step = args.per_device_train_batch_size * args.block_size
    timed = run["seconds"]
    for name, model in models.items():
        steady = timed[name][1:] if args.torch_compile else timed[name]  # the first compiled step compiles
        row = {
            "model": name,
            "config": VARIANTS.get(name),
            "hidden_size": shape["hidden_size"],
            "num_hidden_layers": shape["num_hidden_layers"],
            "parameters": model.num_parameters(),
            "train_tokens_per_second": tokens_per_step / statistics.median(steady),
            "generation_tokens_per_second": (
                args.gen_tokens / statistics.median(generation[name]) if generation[name] else None
            ),
            "peak_memory_bytes": memory[name],
            "val_loss": estimate_loss(
                model,
                val_ids,
                args.per_device_train_batch_size,
                args.block_size,
                args.eval_batches,
                0,
                device,
            ),
            "train_seconds": sum(timed[name]),
            "first_step_seconds": timed[name][0],
        }
        rows.append(row)
        print(
            f"{name} (width {shape['hidden_size']}): val loss {row['val_loss']:.4f}, "
            f"{row['train_tokens_per_second']:,.0f} tok/s",
            flush=True,
        )
    llama = next(row for row in rows if row["model"] == LLAMA)
    for row in rows:
        row["train_throughput_ratio"] = row["train_tokens_per_second"] / llama["train_tokens_per_second"]
        gen, base = row["generation_tokens_per_second"], llama["generation_tokens_per_second"]
        row["generation_ratio"] = gen / base if gen and base else None
        row["memory_ratio"] = row["peak_memory_bytes"] / llama["peak_memory_bytes"]
    return rows


def results_table(rows: list[dict]) -> str:
    headers = [
        "model",
        "width",
        "params",
        "train tok/s",
        "train vs Llama",
        "decode tok/s",
        "decode vs Llama",
        "peak mem (MiB)",
        "val loss",
    ]
    cells = []
    for row in rows:
        gen = row["generation_tokens_per_second"]
        cells.append(
            [
                row["model"],
                row["hidden_size"],
                f"{row['parameters']:,}",
                f"{row['train_tokens_per_second']:,.0f}",
                f"{row['train_throughput_ratio']:.2f}",
                f"{gen:,.0f}" if gen else None,
                f"{row['generation_ratio']:.2f}" if gen else None,
                f"{row['peak_memory_bytes'] / 2**20:.1f}",
                f"{row['val_loss']:.4f}",
            ]
        )
    return markdown_table(headers, cells, align="lrrrrrrrr")


def run_equal_time(tokenizer, train_ids, val_ids, args, device) -> dict:
    """Every model trains for the wall-clock time of Llama's `args.max_steps` steps. Each model's step count
    (and so its cosine schedule) comes from its step time relative to Llama's in an interleaved calibration of
    `args.calibration_steps`; all models then train round robin. Llama is also run parameter-matched
    (`intermediate_size` raised until its parameters match the n=4 delta model's within 2 %)."""
    shape = dict(SMALL_CPU_SHAPE)
    max_positions = args.block_size
    ddl = build_model("ddl-mhc n=4 delta rtbp", tokenizer, max_positions, shape)
    matched = parameter_matched_intermediate(tokenizer, max_positions, shape, ddl.num_parameters())
    builders = {name: (name, None) for name in EQUAL_TIME_VARIANTS}
    builders["llama param-matched"] = (LLAMA, matched)
    per_seed = []
    for seed in args.seeds:
        seed_args = copy.copy(args)
        seed_args.seed = seed
        models = {}
        for name, (base, intermediate) in builders.items():
            torch.manual_seed(seed)
            models[name] = build_model(base, tokenizer, max_positions, shape, intermediate).to(device)
        step_time = interleaved_step_seconds(models, train_ids, seed_args, args.calibration_steps)
        steps = {name: max(1, round(args.max_steps * step_time[LLAMA] / step_time[name])) for name in models}
        trainers = {}
        for name, model in models.items():
            model_args = copy.copy(seed_args)
            model_args.max_steps = steps[name]
            model_args.warmup_steps = round(args.warmup_steps * steps[name] / args.max_steps)
            trainers[name] = build_trainer(model, train_ids, model_args)
        run = train_trainers_round_robin(trainers)
        results = {}
        for name, model in models.items():
            loss = estimate_loss(
                model,
                val_ids,
                args.per_device_train_batch_size,
                args.block_size,
                args.eval_batches,
                0,
                device,
            )
            results[name] = {
                "steps": steps[name],
                "parameters": model.num_parameters(),
                "train_seconds": sum(run["seconds"][name]),
                "val_loss": loss,
            }
            print(
                f"seed {seed} {name}: {steps[name]} steps in {results[name]['train_seconds']:.0f} s, "
                f"val loss {loss:.4f}",
                flush=True,
            )
        per_seed.append({"seed": seed, "results": results})
    return {
        "per_seed": per_seed,
        "parameter_matched_intermediate_size": matched,
        **summarize_equal_time(per_seed),
    }


def summarize_equal_time(per_seed: list[dict]) -> dict:
    """Mean ± std over seeds per model, the table and the verdict: does n=4 delta beat the better Llama by
    more than the largest seed spread?"""
    summary = {}
    for name in per_seed[0]["results"]:
        losses = [entry["results"][name]["val_loss"] for entry in per_seed]
        summary[name] = {
            "val_loss_mean": statistics.mean(losses),
            "val_loss_std": statistics.stdev(losses) if len(losses) > 1 else 0.0,
            "steps_mean": statistics.mean(entry["results"][name]["steps"] for entry in per_seed),
            "train_seconds_mean": statistics.mean(
                entry["results"][name]["train_seconds"] for entry in per_seed
            ),
            "parameters": per_seed[0]["results"][name]["parameters"],
        }
    table = markdown_table(
        ["model", "params", "steps in Llama's time", "train s", "val loss (mean ± std)"],
        [
            [
                name,
                f"{entry['parameters']:,}",
                f"{entry['steps_mean']:.0f}",
                f"{entry['train_seconds_mean']:.0f}",
                f"{entry['val_loss_mean']:.4f} ± {entry['val_loss_std']:.4f}",
            ]
            for name, entry in summary.items()
        ],
        align="lrrrr",
    )
    best_llama = min(summary[LLAMA]["val_loss_mean"], summary["llama param-matched"]["val_loss_mean"])
    ddl_entry = summary["ddl-mhc n=4 delta rtbp"]
    spread = max(entry["val_loss_std"] for entry in summary.values())
    verdict = (
        "beats" if best_llama - ddl_entry["val_loss_mean"] > spread else "does not beat"
    ) + " the better Llama at equal time by more than the largest seed spread"
    return {
        "summary": summary,
        "verdict": f"ddl-mhc n=4 delta rtbp {verdict} ({spread:.4f})",
        "markdown": table,
    }


def run_profile(args, device) -> dict:
    """Mechanism profile of one n=4 delta training step at widths 128 and 512 (reference and fused paths),
    with Llama of the same shape for scale."""
    profiles, tables = {}, {}
    for width in args.profile_widths:
        shape = shape_for(width, SMALL_CPU_SHAPE["num_hidden_layers"])
        fields = dict(shape, vocab_size=65)
        batch = torch.randint(
            0,
            65,
            (args.per_device_train_batch_size, args.block_size),
            generator=torch.Generator().manual_seed(0),
        )
        batch = batch.to(device)
        models = {}
        torch.manual_seed(args.seed)
        models["llama"] = LlamaForCausalLM(LlamaConfig(**fields)).to(device)
        for label in ("reference", "fused"):
            torch.manual_seed(args.seed)
            config = geoformers.DDLmHCConfig(**fields, hc_streams=4, residual="delta")
            model = geoformers.DDLmHCForCausalLM(config).to(device)
            if label == "reference":  # the same model in plain PyTorch
                model = on_ops_path(model, "naive")
            models[f"n=4 delta rtbp, {label}"] = model
        entries = profile_training_steps(models, batch)
        profiles[width] = entries
        tables[width] = markdown_profile(entries)
        print(
            f"\nwidth {width}, batch {args.per_device_train_batch_size} x block {args.block_size}\n"
            f"{tables[width]}",
            flush=True,
        )
    return {"profiles": profiles, "markdown": tables}


@dataclass
class BenchArguments:
    """The modes (variant table by default, --profile, --sweep, --equal_time) and their settings."""

    _argument_group_name = "benchmark"

    gen_tokens: int = field(default=200, metadata={"help": "tokens per timed decode"})
    gen_reps: int = field(default=3, metadata={"help": "decode repetitions (median)"})
    variants: list[str] = field(default_factory=lambda: list(VARIANTS), metadata={"choices": list(VARIANTS)})
    profile: bool = field(default=False, metadata={"help": "mechanism profile of one n=4 step"})
    profile_widths: list[int] = field(default_factory=lambda: [128, 512])
    sweep: bool = field(default=False, metadata={"help": "widths x (Llama, n=1, n=4, peer mHC)"})
    widths: list[int] = field(default_factory=lambda: [128, 256, 512])
    layers: int = field(default=SMALL_CPU_SHAPE["num_hidden_layers"], metadata={"help": "--sweep's depth"})
    no_peer: bool = field(default=False, metadata={"help": "leave the hyper-connections peer row out"})
    equal_time: bool = field(default=False, metadata={"help": "equal wall-clock budget, several seeds"})
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2], metadata={"help": "--equal_time's seeds"})
    calibration_steps: int = field(default=30, metadata={"help": "--equal_time's interleaved timing steps"})
    merge: list[str] | None = field(
        default=None, metadata={"help": "--equal_time: combine the JSON of seed runs"}
    )


def main() -> None:
    parser = lm_parser(
        BenchArguments, description=__doc__, output_dir=str(REPO_ROOT / "outputs" / "benchmarks")
    )
    args = parser.parse_args()
    set_threads(args.threads)
    device = training_arguments(args).device
    if args.torch_compile:  # every model (train, eval and decode graphs) shares the forward's code object
        torch._dynamo.config.recompile_limit = 64
    mode = "profile" if args.profile else "sweep" if args.sweep else "equal_time" if args.equal_time else None
    suffix = f"_{mode}" if mode else ""
    suffix += "_compiled" if args.torch_compile and mode != "equal_time" else ""
    suffix += f"_{device.type}" if device.type != "cpu" else ""
    output = Path(args.output_dir) / f"causal_lm{suffix}.json"

    report = {
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "targets": TARGETS,
    }
    if args.profile:
        report.update(run_profile(args, device))
    else:
        tokenizer, train_ids, val_ids = load_corpus(args.data)
        if args.equal_time and args.merge:
            runs = [json.loads(Path(path).read_text()) for path in args.merge]
            per_seed = [entry for run in runs for entry in run["per_seed"]]
            report.update(per_seed=per_seed, merged=args.merge, **summarize_equal_time(per_seed))
            report["parameter_matched_intermediate_size"] = runs[0]["parameter_matched_intermediate_size"]
            print(f"\n{report['markdown']}\n{report['verdict']}")
        elif args.equal_time:
            report.update(run_equal_time(tokenizer, train_ids, val_ids, args, device))
            print(f"\n{report['markdown']}\n{report['verdict']}")
        else:
            rows = []
            if args.sweep:
                variants = GPU_SWEEP_VARIANTS if device.type == "cuda" else SWEEP_VARIANTS
                names = [name for name in variants if not (args.no_peer and name == PEER)]
                for width in args.widths:
                    rows += measure(
                        names, tokenizer, train_ids, val_ids, args, device, shape_for(width, args.layers)
                    )
            else:
                rows = measure(
                    args.variants, tokenizer, train_ids, val_ids, args, device, dict(SMALL_CPU_SHAPE)
                )
            report["results"] = rows
            report["markdown"] = results_table(rows)
            print(
                f"\n{args.max_steps} steps, batch {args.per_device_train_batch_size} x "
                f"block {args.block_size}, "
                f"device {device}, "
                f"{'compiled (train) + static cache compiled (decode)' if args.torch_compile else 'eager'}"
            )
            print(report["markdown"])
    write_results(output, "bench_causal_lm.py", None, run_settings(args, BenchArguments), report)


if __name__ == "__main__":
    main()
