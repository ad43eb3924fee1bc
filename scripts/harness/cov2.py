"""The synthetic CoV-2 lineage task of `exp_cov2.py` (docs/experiments.md, 'exp_cov2.py'): its flags and
data, shared with the sweeps that rerun its recipe (`exp_grown_vs_swept.py`)."""

from __future__ import annotations

import argparse

from geoformers.tokenization.kmer_tokenizer import build_kmer_tokenizer
from geoformers.training.synthetic_tasks import build_cov2_variant_task

from harness.flags import add_experiment_arguments, check_experiment_arguments
from harness.results import REPO_ROOT


def parse_args(argv: list[str] | None, description: str | None = None) -> argparse.Namespace:
    """`exp_cov2.py`'s flags: the task's, the output folder and the shared ones with its defaults."""
    parser = argparse.ArgumentParser(description=description)
    task = parser.add_argument_group("task (build_cov2_variant_task)")
    task.add_argument("--num_train_per_lineage", type=int, default=200)
    task.add_argument("--num_validation_per_lineage", type=int, default=50)
    task.add_argument("--genome_length", type=int, default=3000)
    task.add_argument("--private_mutations", type=int, default=6)
    task.add_argument("--background_rate", type=float, default=1e-3)
    task.add_argument("--error_rate", type=float, default=2e-3)
    task.add_argument("--n_rate", type=float, default=5e-3)
    task.add_argument("--fragment_length", type=int, default=None, help="random windows of this many bases")
    task.add_argument("--kmer_size", type=int, default=6)
    task.add_argument("--kmer_stride", type=int, default=None, help="default kmer_size (non-overlapping)")
    task.add_argument("--data_seed", type=int, default=0)
    parser.add_argument(
        "--output_dir", default=str(REPO_ROOT / "outputs" / "cov2"), help="results/cov2: the committed run"
    )
    add_experiment_arguments(parser)
    parser.set_defaults(max_steps=300, pre_growth_steps=100, eval_steps=100, probe_every=50)
    args = parser.parse_args(argv)
    check_experiment_arguments(parser, args)
    return args


def build_task(args: argparse.Namespace):
    """The flags' task (k-mer ids, no raw sequences) -> (task, k-mer vocabulary size, tokens per row)."""
    task = build_cov2_variant_task(
        num_train_per_lineage=args.num_train_per_lineage,
        num_validation_per_lineage=args.num_validation_per_lineage,
        genome_length=args.genome_length,
        private_mutations=args.private_mutations,
        background_rate=args.background_rate,
        error_rate=args.error_rate,
        n_rate=args.n_rate,
        fragment_length=args.fragment_length,
        kmer_size=args.kmer_size,
        kmer_stride=args.kmer_stride,
        seed=args.data_seed,
    ).remove_columns("sequence")
    return task, len(build_kmer_tokenizer(args.kmer_size)), len(task["train"][0]["input_ids"])
