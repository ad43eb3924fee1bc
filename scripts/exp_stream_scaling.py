"""How the doubly-stochastic charts scale with the number of streams n (docs/stream_scaling.md).

For every seed, n in `--streams` and chart in `--charts`, a DDL-mHC causal LM (delta residual, the defaults of
`DDLmHCConfig`) trains on character-level tiny-shakespeare with the recipe and shape of
`bench_causal_lm.py` (AdamW lr 1e-3, warm-up + cosine, 4 layers, width 128, block 64, batch 12;
the scripts' `Trainer`, `harness.causal_lm.build_trainer`). Per run:

- `val_loss`: `estimate_loss` on `--eval_batches` fixed validation windows after `--max_steps` steps;
- `train_tokens_per_second`: tokens per step / median step time of the run;
- `train_throughput_ratio`: Llama's median step time / the model's, from `--timing_steps` steps of fresh
  copies of both run round robin (one step each in turn) just before the run, the first two left out;
- `peak_memory_bytes`: `bench_causal_lm.training_memory_bytes` (parameters + gradients + AdamW state + the
  tensors autograd saves for one step, counted once per storage; CUDA: peak allocated) and its ratio to Llama;
- `ds_error`: the worst max |row/column sum - 1| (`birkhoff.ds_violation`) over every H_res of every sublayer
  and token of a fixed validation probe batch after training, and `min_entry`, the smallest entry;
- `gain_forward` / `gain_backward`: the largest composite Amax gain of `hc_diagnostics` (products
  H_res^(k) ... H_res^(1) over the sublayers, mHC arXiv 2512.24880) on the same probe.

A Llama of the same shape trains `--max_steps` steps per seed on the same batches too: the val-loss reference,
paired by seed. After every run `summary.json` is rewritten (per-run records, the mean over seeds per (chart,
n), val loss minus the same seed's Llama's, a markdown table and `markdown_by_n`, chart × n), after every n
`stream_scaling.png` (that paired loss difference and the throughput ratio against n, one line per chart), so
an interrupted grid keeps the runs it finished. A later invocation with the same design (every setting but
`--seeds`, `--streams`, `--charts` and `--save_models`) keeps the runs and Llama references of the file and
trains only the (seed, n, chart) it lacks, so the grid can be grown over several sessions (one process per
output folder); a different design is an error naming the settings that differ (another `--output_dir` starts
a new grid). `--merge DIR ...` first adds the runs and Llama
references of other folders' `summary.json` (same design, else an error) that this one lacks, so a grid split
over parallel processes, each in its own folder, ends in one summary. `--calibrate` only times the interleaved
steps of every (n, chart) and prints the projected cost of the grid.

    python scripts/exp_stream_scaling.py             # full design, 2,000 steps, into outputs/stream_scaling
    python scripts/exp_stream_scaling.py --output_dir results/stream_scaling_2000   # grows the committed grid
    python scripts/exp_stream_scaling.py --calibrate # s/step per (n, chart)
    python scripts/exp_stream_scaling.py --max_steps 300 --warmup_steps 15 --seeds 0 --output_dir out/x
    python scripts/exp_stream_scaling.py --seeds 0 --streams 16 --output_dir OTHER    # in a parallel process,
    python scripts/exp_stream_scaling.py --seeds 0 --streams 16 --merge OTHER          # then merged
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from matplotlib.figure import Figure

import geoformers
from geoformers.models.ddl_mhc.chart_specs import METHODS
from geoformers.models.ddl_mhc.ops.charts import ds_violation, num_logits
from geoformers.training.hc_diagnostics import KEY_PATTERN, hc_diagnostics

from harness.causal_lm import (
    LLAMA,
    SMALL_CPU_SHAPE,
    build_trainer,
    estimate_loss,
    get_batch,
    in_current_names,
    interleaved_step_seconds,
    load_corpus,
    run_settings,
    shape_for,
    train_trainers_round_robin,
    training_memory_bytes,
)
from harness.flags import training_arguments
from harness.lm_trainer import lm_parser
from harness.results import REPO_ROOT, markdown_table, mean_std, write_results
from harness.threads import set_threads

# msrtbp: the margined scaled RTBP of the TBP authors (docs/chart_variants.md), the variant whose changes
# address what grows with n: the depth of RTBP's splits (narrow intervals, vanishing gradients) and the
# number of entries that can collapse to an interval end.
DEFAULT_CHARTS = ("sinkhorn", "kromhc", "tbp", "rtbp", "msrtbp")
DEFAULT_STREAMS = (4, 8, 16)
PROBE_SEED = 0  # the validation windows of the DS-error / gain probe (estimate_loss uses seed 0 too)
SUMMARY_FILE = "summary.json"
FIGURE_FILE = "stream_scaling.png"


def model_fields(tokenizer, shape: dict, block_size: int) -> dict:
    """Decoder fields shared by the DDL-mHC models and their Llama: `shape` plus the tokenizer's ids."""
    return dict(
        shape,
        vocab_size=len(tokenizer),
        max_position_embeddings=block_size,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def build_ddl(tokenizer, shape: dict, block_size: int, n: int, chart: str):
    fields = model_fields(tokenizer, shape, block_size)
    return geoformers.DDLmHCForCausalLM(geoformers.DDLmHCConfig(**fields, hc_streams=n, hc_chart=chart))


def build_llama(tokenizer, shape: dict, block_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**model_fields(tokenizer, shape, block_size)))


def probe_batch(val_ids: torch.Tensor, args) -> torch.Tensor:
    """The fixed validation windows on which the mixing matrices and gains are read."""
    return get_batch(
        val_ids, args.per_device_train_batch_size, args.block_size, torch.Generator().manual_seed(PROBE_SEED)
    )


@torch.no_grad()
def mixing_metrics(model, probe: torch.Tensor, device: torch.device) -> dict:
    """Worst DS error and smallest entry of every H_res on `probe`, and the largest composite gains."""
    was_training = model.training
    model.eval()
    try:
        records = model(input_ids=probe.to(device), output_mixing=True, use_cache=False).mixing
    finally:
        model.train(was_training)
    matrices = [record.h_res for record in records if record.h_res is not None]
    diagnostics = hc_diagnostics(model, probe)
    gains = {"gain_forward": [], "gain_backward": []}
    for key, value in diagnostics.items():
        metric = KEY_PATTERN.match(key)["metric"]
        if metric in gains:
            gains[metric].append(value)
    return {
        "ds_error": max(float(ds_violation(h).max()) for h in matrices),
        "min_entry": min(float(h.detach().min()) for h in matrices),
        "gain_forward": max(gains["gain_forward"]),
        "gain_backward": max(gains["gain_backward"]),
    }


def train(model, train_ids, val_ids, args, device) -> dict:
    """`args.max_steps` steps through the scripts' `Trainer` (`build_trainer`); the validation loss and median
    step time."""
    trainer = build_trainer(model, train_ids, args)
    seconds = train_trainers_round_robin({"run": trainer})["seconds"]["run"]
    median = statistics.median(seconds)
    loss = estimate_loss(
        model, val_ids, args.per_device_train_batch_size, args.block_size, args.eval_batches, 0, device
    )
    return {
        "val_loss": loss,
        "train_seconds": sum(seconds),
        "median_step_seconds": median,
        "train_tokens_per_second": args.per_device_train_batch_size * args.block_size / median,
    }


def run_one(seed: int, n: int, chart: str, data, shape: dict, llama_memory: int, args, device) -> dict:
    """One (seed, n, chart) run: interleaved timing against Llama, training, the end-of-training metrics."""
    tokenizer, train_ids, val_ids = data
    run_args = copy.copy(args)
    run_args.seed = seed
    torch.manual_seed(seed)
    model = build_ddl(tokenizer, shape, args.block_size, n, chart).to(device)
    torch.manual_seed(seed)
    llama = build_llama(tokenizer, shape, args.block_size).to(device)
    timing = interleaved_step_seconds(
        {"ddl": model, LLAMA: llama}, train_ids, run_args, run_args.timing_steps
    )
    memory = training_memory_bytes(model, probe_batch(train_ids, args).to(device), device)
    record = {
        "chart": chart,
        "n": n,
        "seed": seed,
        "parameters": model.num_parameters(),
        "chart_logits_per_matrix": num_logits(chart, n),
        **train(model, train_ids, val_ids, run_args, device),
        "timing_median_step_seconds": timing["ddl"],
        "timing_llama_median_step_seconds": timing[LLAMA],
        "train_throughput_ratio": timing[LLAMA] / timing["ddl"],
        "peak_memory_bytes": memory,
        "memory_ratio": memory / llama_memory,
        **mixing_metrics(model, probe_batch(val_ids, args), device),
    }
    if args.save_models:
        model.save_pretrained(Path(args.output_dir) / "models" / f"{chart}_n{n}_seed{seed}")
    print(
        f"seed {seed} n={n} {chart}: val loss {record['val_loss']:.4f}, "
        f"{record['train_tokens_per_second']:,.0f} tok/s ({record['train_throughput_ratio']:.2f} x Llama), "
        f"DS error {record['ds_error']:.2e}, gains {record['gain_forward']:.6f} / "
        f"{record['gain_backward']:.6f}, {record['train_seconds']:.0f} s",
        flush=True,
    )
    return record


def spread(mean: float, std: float, seeds: int, digits: int = 4, sign: str = "") -> str:
    """A table cell: the mean, and ± the std where there are several seeds."""
    return f"{mean:{sign}.{digits}f}" + (f" ± {std:.{digits}f}" if seeds > 1 else "")


def summarize(runs: list[dict], llama_runs: list[dict]) -> tuple[list[dict], str]:
    """Mean over seeds per (chart, n) (std of the val loss; the worst DS error and gains) and its table.

    `val_loss_vs_llama_*`: the mean and std over seeds of val loss minus the same seed's Llama's (the models
    of a seed see the same batches, so the pair shares the batch order's noise), where every seed of the
    group has its Llama; None otherwise. Rows of a grid still growing can hold different seeds: the table's
    `seeds` column says how many."""
    llama_loss = {run["seed"]: run["val_loss"] for run in llama_runs}
    groups: dict[tuple[str, int], list[dict]] = {}
    for run in runs:
        groups.setdefault((run["chart"], run["n"]), []).append(run)
    summary = []
    for (chart, n), group in groups.items():
        loss_mean, loss_std = mean_std([run["val_loss"] for run in group])
        paired = (
            [run["val_loss"] - llama_loss[run["seed"]] for run in group]
            if all(run["seed"] in llama_loss for run in group)
            else None
        )
        paired_mean, paired_std = mean_std(paired) if paired else (None, None)
        summary.append(
            {
                "chart": chart,
                "n": n,
                "seeds": sorted(run["seed"] for run in group),
                "parameters": group[0]["parameters"],
                "val_loss_mean": loss_mean,
                "val_loss_std": loss_std,
                "val_loss_vs_llama_mean": paired_mean,
                "val_loss_vs_llama_std": paired_std,
                **{
                    key: statistics.mean(run[key] for run in group)
                    for key in (
                        "train_tokens_per_second",
                        "train_throughput_ratio",
                        "peak_memory_bytes",
                        "memory_ratio",
                    )
                },
                **{
                    key: max(run[key] for run in group)
                    for key in ("ds_error", "gain_forward", "gain_backward")
                },
                "min_entry": min(run["min_entry"] for run in group),
            }
        )
    rows = (
        [
            [
                "llama (transformers)",
                1,
                len(llama_runs),
                f"{llama_runs[0]['parameters']:,}",
                spread(*mean_std([run["val_loss"] for run in llama_runs]), len(llama_runs)),
                "0",
                f"{statistics.mean(run['train_tokens_per_second'] for run in llama_runs):,.0f}",
                "1",
                "1",
                None,
                None,
                None,
            ]
        ]
        if llama_runs
        else []
    )
    rows += [
        [
            entry["chart"],
            entry["n"],
            len(entry["seeds"]),
            f"{entry['parameters']:,}",
            spread(entry["val_loss_mean"], entry["val_loss_std"], len(entry["seeds"])),
            None
            if entry["val_loss_vs_llama_mean"] is None
            else spread(
                entry["val_loss_vs_llama_mean"], entry["val_loss_vs_llama_std"], len(entry["seeds"]), sign="+"
            ),
            f"{entry['train_tokens_per_second']:,.0f}",
            f"{entry['train_throughput_ratio']:.2f}",
            f"{entry['memory_ratio']:.2f}",
            f"{entry['ds_error']:.1e}",
            f"{entry['min_entry']:.1e}",
            f"{entry['gain_forward'] - 1:+.1e} / {entry['gain_backward'] - 1:+.1e}",
        ]
        for entry in sorted(summary, key=lambda entry: (entry["n"], entry["chart"]))
    ]
    table = markdown_table(
        [
            "chart",
            "n",
            "seeds",
            "params",
            "val loss",
            "val loss - Llama's (same seed)",
            "train tok/s",
            "tok/s vs Llama",
            "memory vs Llama",
            "worst DS error",
            "min entry",
            "gain - 1 (fwd / bwd)",
        ],
        rows,
        align="lrrrrrrrrrrr",
    )
    return summary, table


def by_n_table(summary: list[dict]) -> str:
    """One row per chart, one column per n: val loss minus the same seed's Llama's (± std over seeds where
    there are several) / train tok/s ratio to Llama; then the worst DS error over every n (the model card's
    table)."""
    ns = sorted({entry["n"] for entry in summary})
    cells = {(entry["chart"], entry["n"]): entry for entry in summary}

    def cell(entry: dict | None) -> str | None:
        if entry is None or entry["val_loss_vs_llama_mean"] is None:
            return None
        loss = spread(
            entry["val_loss_vs_llama_mean"],
            entry["val_loss_vs_llama_std"],
            len(entry["seeds"]),
            digits=3,
            sign="+",
        )
        return f"{loss} / {entry['train_throughput_ratio']:.2f}×"

    rows = [
        [
            chart,
            *(cell(cells.get((chart, n))) for n in ns),
            f"{max(entry['ds_error'] for entry in summary if entry['chart'] == chart):.1e}",
        ]
        for chart in sorted({entry["chart"] for entry in summary})
    ]
    return markdown_table(
        ["chart", *(f"n = {n}" for n in ns), "worst DS error"], rows, align="l" + "r" * (len(ns) + 1)
    )


def plot(summary: list[dict], path: Path) -> None:
    """Val loss minus the same seed's Llama's (mean ± std over seeds) and throughput ratio against n, one line
    per chart; Llama dashed (0 and 1)."""
    figure = Figure(figsize=(10, 4))
    figure.subplots_adjust(left=0.08, right=0.98, bottom=0.13, top=0.96, wspace=0.25)
    loss_axes, ratio_axes = figure.subplots(1, 2)
    for chart in dict.fromkeys(entry["chart"] for entry in summary):
        entries = sorted((entry for entry in summary if entry["chart"] == chart), key=lambda e: e["n"])
        paired = [entry for entry in entries if entry["val_loss_vs_llama_mean"] is not None]
        loss_axes.errorbar(
            [e["n"] for e in paired],
            [e["val_loss_vs_llama_mean"] for e in paired],
            yerr=[e["val_loss_vs_llama_std"] for e in paired],
            marker="o",
            capsize=3,
            label=chart,
        )
        ratio_axes.plot(
            [e["n"] for e in entries], [e["train_throughput_ratio"] for e in entries], marker="o", label=chart
        )
    loss_axes.axhline(0.0, color="gray", linestyle="--", label="llama")
    ratio_axes.axhline(1.0, color="gray", linestyle="--", label="llama")
    for axes, label in ((loss_axes, "val loss - Llama's (same seed)"), (ratio_axes, "train tok/s / Llama's")):
        axes.set_xscale("log", base=2)
        axes.set_xlabel("streams n")
        axes.set_ylabel(label)
        axes.grid(alpha=0.3)
    loss_axes.legend()
    figure.savefig(path, dpi=120)


def calibrate(data, shape: dict, args, device) -> None:
    """Interleaved s/step of every (n, chart) against Llama and the projected cost of the grid."""
    tokenizer, train_ids, _ = data
    total = 0.0
    for n in args.streams:
        for chart in args.charts:
            torch.manual_seed(args.seeds[0])
            models = {
                chart: build_ddl(tokenizer, shape, args.block_size, n, chart).to(device),
                LLAMA: build_llama(tokenizer, shape, args.block_size).to(device),
            }
            seconds = interleaved_step_seconds(models, train_ids, args, args.timing_steps)
            steps = args.max_steps + args.timing_steps
            total += seconds[chart] * steps + seconds[LLAMA] * args.timing_steps
            print(
                f"n={n} {chart}: {seconds[chart]:.4f} s/step, Llama {seconds[LLAMA]:.4f} s/step "
                f"(ratio {seconds[LLAMA] / seconds[chart]:.2f})",
                flush=True,
            )
    total += seconds[LLAMA] * args.max_steps
    hours = total * len(args.seeds) / 3600
    print(f"projected: {hours:.2f} h for {len(args.seeds)} seed(s) x {args.max_steps} steps")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """parser.error naming the flag for values the grid would reject late or silently."""
    positive = ("max_steps", "timing_steps", "per_device_train_batch_size", "block_size", "eval_batches")
    for name in (*positive, "width", "layers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.timing_steps < 3:
        parser.error(f"--timing_steps must be >= 3 (the first two are left out), got {args.timing_steps}")
    if args.threads < 0:
        parser.error(f"--threads must be >= 0 (0: torch's default), got {args.threads}")
    if not args.seeds or not args.streams or not args.charts:
        parser.error("--seeds, --streams and --charts each need at least one value")
    for n in args.streams:
        if n < 2:
            parser.error(f"--streams must all be >= 2 (n = 1 has no H_res), got {n}")
    for chart in args.charts:
        for n in args.streams:
            try:
                num_logits(chart, n)
            except ValueError as error:
                parser.error(f"--charts {chart} with --streams {n}: {error}")
    if args.width % SMALL_CPU_SHAPE["num_attention_heads"]:
        parser.error(
            f"--width must be a multiple of {SMALL_CPU_SHAPE['num_attention_heads']} (heads), "
            f"got {args.width}"
        )


GRID_SETTINGS = ("seeds", "streams", "charts", "save_models")  # what may change between resumed invocations


def design_settings(args: argparse.Namespace) -> dict:
    """A report's `settings`: the recipe and the grid (`run_settings`), not where the data come from, where
    the results go or what is merged."""
    return run_settings(args, GridArguments, leave_out=("merge",))


def design_differences(saved: dict, settings: dict) -> list[str]:
    """Where a saved report's settings `saved` differ from `settings`, but for the grid's own lists
    (GRID_SETTINGS): one "name: value there, value here" per setting, "absent" where one of them lacks it."""
    saved = in_current_names(saved)
    names = sorted((set(saved) | set(settings)) - set(GRID_SETTINGS))
    return [
        f"{name}: {saved.get(name, 'absent')!r} there, {settings.get(name, 'absent')!r} here"
        for name in names
        if name not in saved or name not in settings or saved[name] != settings[name]
    ]


def run_key(run: dict) -> tuple:
    """What makes two runs the same run of one design."""
    return run["seed"], run["n"], run["chart"]


def add_runs(report: dict, other: dict) -> None:
    """Add to `report` the runs (by `run_key`) and Llama references (by seed) of `other`, a report of the same
    design, that it lacks; the grid settings become the union of both."""
    have = {run_key(run) for run in report["runs"]}
    report["runs"] += [run for run in other["runs"] if run_key(run) not in have]
    seeds = {run["seed"] for run in report["llama"]}
    report["llama"] += [run for run in other["llama"] if run["seed"] not in seeds]
    for key in ("seeds", "streams", "charts"):
        report["settings"][key] = sorted(set(report["settings"][key]) | set(other["settings"][key]))


def merge_reports(report: dict, folders: list[str]) -> None:
    """`add_runs` of each folder's summary.json. A folder without a summary or with another design is an error
    naming it and the settings that differ, as a silent skip would drop its runs."""
    for folder in folders:
        path = Path(folder) / SUMMARY_FILE
        if not path.is_file():
            raise ValueError(f"--merge {folder}: no {SUMMARY_FILE} there")
        other = json.loads(path.read_text())
        differences = design_differences(other["settings"], report["settings"])
        if differences:
            raise ValueError(
                f"--merge {folder}: its design differs from this invocation's: {'; '.join(differences)}"
            )
        add_runs(report, other)
        print(f"merged {path}", flush=True)


@dataclass
class GridArguments:
    """The grid (seeds x streams x charts), the shape, the timing, and folders to merge."""

    _argument_group_name = "grid"

    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    streams: list[int] = field(default_factory=lambda: list(DEFAULT_STREAMS), metadata={"help": "n values"})
    charts: list[str] = field(default_factory=lambda: list(DEFAULT_CHARTS), metadata={"choices": METHODS})
    width: int = field(default=SMALL_CPU_SHAPE["hidden_size"], metadata={"help": "hidden_size"})
    layers: int = field(default=SMALL_CPU_SHAPE["num_hidden_layers"], metadata={"help": "num_hidden_layers"})
    timing_steps: int = field(default=20, metadata={"help": "interleaved steps of the tok/s ratio"})
    calibrate: bool = field(default=False, metadata={"help": "only time every (n, chart) and project"})
    save_models: bool = field(default=False, metadata={"help": "save_pretrained every trained model"})
    merge: list[str] = field(
        default_factory=list,
        metadata={
            "metavar": "DIR",
            "help": "first add the runs of other folders' summary.json (same design) this one lacks",
        },
    )


def grid_parser():
    return lm_parser(
        GridArguments, description=__doc__, output_dir=str(REPO_ROOT / "outputs" / "stream_scaling")
    )


def main(argv: list[str] | None = None) -> dict:
    parser = grid_parser()
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    set_threads(args.threads)
    device = training_arguments(args).device
    shape = shape_for(args.width, args.layers)
    data = load_corpus(args.data)
    if args.calibrate:
        calibrate(data, shape, args, device)
        return {}
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "settings": design_settings(args),
        "shape": shape,
        "memory_measure": "parameters + gradients + AdamW state + autograd's saved tensors of one step "
        "(harness.causal_lm.training_memory_bytes; CUDA: peak allocated)",
        "llama": [],
        "runs": [],
    }
    path = output_dir / SUMMARY_FILE
    if path.exists():
        saved = json.loads(path.read_text())
        differences = design_differences(saved["settings"], report["settings"])
        if differences:
            parser.error(
                f"{path} holds a grid of another design ({'; '.join(differences)}); resume it with its "
                "settings or start a new grid in another --output_dir"
            )
        add_runs(report, saved)
        print(f"resuming {path}: {len(saved['runs'])} runs kept", flush=True)
    try:
        merge_reports(report, args.merge)
    except ValueError as error:
        parser.error(str(error))

    def save() -> None:
        report["summary"], report["markdown"] = summarize(report["runs"], report["llama"])
        report["markdown_by_n"] = by_n_table(report["summary"])
        content = {key: value for key, value in report.items() if key != "settings"}
        write_results(path, "exp_stream_scaling.py", argv, report["settings"], content)

    tokenizer, train_ids, val_ids = data
    for seed in args.seeds:
        llama_run = next((run for run in report["llama"] if run["seed"] == seed), None)
        if llama_run is None:
            torch.manual_seed(seed)
            llama = build_llama(tokenizer, shape, args.block_size).to(device)
            llama_memory = training_memory_bytes(llama, probe_batch(train_ids, args).to(device), device)
            seed_args = copy.copy(args)
            seed_args.seed = seed
            trained = train(llama, train_ids, val_ids, seed_args, device)
            llama_run = {
                "seed": seed,
                "parameters": llama.num_parameters(),
                "peak_memory_bytes": llama_memory,
                **trained,
            }
            report["llama"].append(llama_run)
            print(
                f"seed {seed} llama: val loss {llama_run['val_loss']:.4f}, "
                f"{llama_run['train_tokens_per_second']:,.0f} tok/s",
                flush=True,
            )
        for n in args.streams:
            for chart in args.charts:
                if (seed, n, chart) in {run_key(run) for run in report["runs"]}:
                    continue
                report["runs"].append(
                    run_one(seed, n, chart, data, shape, llama_run["peak_memory_bytes"], args, device)
                )
                save()
            save()
            plot(report["summary"], output_dir / FIGURE_FILE)
    print(f"\n{report['markdown']}\nwrote {output_dir / SUMMARY_FILE} and {output_dir / FIGURE_FILE}")
    return report


if __name__ == "__main__":
    main()
