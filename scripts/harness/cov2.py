"""The synthetic CoV-2 lineage task of `exp_cov2.py` (docs/experiments.md, 'exp_cov2.py'): its flags and
data, shared with the sweeps that rerun its recipe (`exp_grown_vs_swept.py`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from geoformers.tokenization.kmer_tokenizer import build_kmer_tokenizer
from geoformers.training.synthetic_tasks import build_cov2_variant_task

from harness.flags import check_experiment_arguments, experiment_parser
from harness.results import REPO_ROOT


@dataclass
class Cov2Arguments:
    """`build_cov2_variant_task`'s fields."""

    _argument_group_name = "task (build_cov2_variant_task)"

    num_train_per_lineage: int = 200
    num_validation_per_lineage: int = 50
    genome_length: int = 3000
    private_mutations: int = 6
    background_rate: float = 1e-3
    error_rate: float = 2e-3
    n_rate: float = 5e-3
    fragment_length: int | None = field(default=None, metadata={"help": "random windows of this many bases"})
    kmer_size: int = 6
    kmer_stride: int | None = field(default=None, metadata={"help": "default kmer_size (non-overlapping)"})
    task_seed: int = field(default=0, metadata={"help": "seed of the generated task"})


def parse_args(argv: list[str] | None, description: str | None = None) -> argparse.Namespace:
    """`exp_cov2.py`'s flags: the task's and the shared ones with its defaults (`--output_dir results/cov2`:
    the committed run)."""
    parser = experiment_parser(
        Cov2Arguments,
        description=description,
        max_steps=300,
        pre_growth_steps=100,
        eval_steps=100,
        probe_every=50,
        output_dir=str(REPO_ROOT / "outputs" / "cov2"),
    )
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
        seed=args.task_seed,
    ).remove_columns("sequence")
    return task, len(build_kmer_tokenizer(args.kmer_size)), len(task["train"][0]["input_ids"])
