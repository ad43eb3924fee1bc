"""The DDL-mHC scripts' `Trainer` (`harness.lm_trainer`) against their hand-written nanoGPT loop
(`harness.causal_lm.make_trainer`) given the same settings (docs/experiments.md, 'Shared causal-LM recipe'):
wall seconds per optimizer step, side by side. Each repetition trains two fresh copies of the model, one
with each; the loop takes its step inside the Trainer run, right after each Trainer step (a callback), so
both see the same machine load step by step. The Trainer's step is the time from one step's end to the next
minus the loop step taken in between. Reported: the median over repetitions of each run's median step (its
first two steps left out), and the largest relative gap between the losses the two log.

    python scripts/bench_lm_trainer.py                         # n = 4 delta rtbp, 4 x 128, batch 12 x 64
"""

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import TrainerCallback, TrainingArguments

import geoformers

from harness.causal_lm import SMALL_CPU_SHAPE, VARIANTS, make_trainer
from harness.flag_checks import CheckedParser
from harness.lm_trainer import NANOGPT_TRAINING_DEFAULTS, build_lm_trainer
from harness.random_windows import RandomWindows
from harness.results import REPO_ROOT, write_results
from harness.threads import DEFAULT_THREADS, THREADS_HELP, set_threads


@dataclass
class BenchArguments:
    variant: str = field(
        default="ddl-mhc n=4 delta rtbp", metadata={"choices": tuple(v for v in VARIANTS if VARIANTS[v])}
    )
    steps: int = field(default=40, metadata={"help": "optimizer steps per run"})
    reps: int = field(default=5, metadata={"help": "runs of each (interleaved)"})
    per_device_train_batch_size: int = 12
    block_size: int = 64
    optim: str = field(
        default="adamw_torch", metadata={"help": "the Trainer's optimizer (adamw_torch: the loop's)"}
    )
    output_dir: Path = field(
        default=REPO_ROOT / "outputs" / "benchmarks", metadata={"help": "folder of the report"}
    )
    threads: int = field(default=DEFAULT_THREADS, metadata={"help": THREADS_HELP})


def build(args, vocab: int):
    torch.manual_seed(0)
    shape = dict(SMALL_CPU_SHAPE, vocab_size=vocab, max_position_embeddings=args.block_size)
    return geoformers.DDLmHCForCausalLM(geoformers.DDLmHCConfig(**shape, **VARIANTS[args.variant]))


def loop_step(args, ids):
    """The hand-written loop's `step()` closure over a fresh model."""
    model = build(args, int(ids.max()) + 1)
    settings = dict(NANOGPT_TRAINING_DEFAULTS, max_steps=args.steps, torch_compile=False, bf16=False)
    settings.update(min_lr_ratio=settings["lr_scheduler_kwargs"]["min_lr_rate"], block_size=args.block_size)
    settings["per_device_train_batch_size"] = args.per_device_train_batch_size
    return make_trainer(model, ids, argparse.Namespace(**settings), torch.device("cpu"))


class InterleavedLoop(TrainerCallback):
    """After each Trainer step, one step of the loop, timed; the Trainer's step time excludes it."""

    def __init__(self, step):
        self.step, self.loop_seconds, self.loop_losses, self.trainer_seconds = step, [], [], []

    def on_train_begin(self, args, state, control, **kwargs):
        self.last = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        start = time.perf_counter()
        self.trainer_seconds.append(start - self.last)
        loss, _ = self.step()
        self.loop_losses.append(loss)
        self.last = time.perf_counter()
        self.loop_seconds.append(self.last - start)


def side_by_side(args, ids, folder) -> InterleavedLoop:
    loop = InterleavedLoop(loop_step(args, ids))
    training_args = TrainingArguments(
        output_dir=folder,
        max_steps=args.steps,
        per_device_train_batch_size=args.per_device_train_batch_size,
        optim=args.optim,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        **NANOGPT_TRAINING_DEFAULTS,
    )
    windows = RandomWindows(ids, args.per_device_train_batch_size, args.block_size, training_args.seed)
    model = build(args, int(ids.max()) + 1)
    trainer = build_lm_trainer(model, training_args, windows, callbacks=[loop], chart_lr_multiplier=1.0)
    trainer.train()
    loop.trainer_losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return loop


def main(argv: list[str] | None = None) -> dict:
    parser = CheckedParser(
        BenchArguments, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    (args,) = parser.parse_args_into_dataclasses(argv)
    set_threads(args.threads)
    ids = torch.randint(65, (50_000,), generator=torch.Generator().manual_seed(0))
    medians, gap = {"loop": [], "trainer": []}, 0.0
    with tempfile.TemporaryDirectory() as folder:
        for rep in range(args.reps):
            run = side_by_side(args, ids, folder)
            medians["loop"].append(statistics.median(run.loop_seconds[2:]))
            medians["trainer"].append(statistics.median(run.trainer_seconds[2:]))
            pairs = zip(run.loop_losses, run.trainer_losses, strict=True)
            gap = max(gap, *(abs(a - b) / abs(a) for a, b in pairs))
            print(
                f"rep {rep + 1}: loop {medians['loop'][-1]:.4f} s, Trainer {medians['trainer'][-1]:.4f} s "
                f"per step; largest relative loss gap {gap:.2e}",
                flush=True,
            )
    loop, trainer = (statistics.median(medians[key]) for key in ("loop", "trainer"))
    print(f"median step: loop {loop:.4f} s, Trainer {trainer:.4f} s, Trainer / loop {trainer / loop:.3f}")
    return write_results(
        Path(args.output_dir) / "lm_trainer.json",
        "bench_lm_trainer.py",
        argv,
        vars(args),
        {
            "rep_medians": medians,
            "loop_seconds": loop,
            "trainer_seconds": trainer,
            "ratio": trainer / loop,
            "largest_relative_loss_gap": gap,
        },
    )


if __name__ == "__main__":
    main()
