"""The planted spectral task of `exp_synthetic.py` (docs/experiments.md, 'exp_synthetic.py'): its flags,
shared with the sweeps that rerun its recipe (`exp_grown_vs_swept.py`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from geoformers.training.synthetic_tasks import DEFAULT_STRENGTHS

from harness.flags import check_experiment_arguments, experiment_parser
from harness.results import REPO_ROOT


@dataclass
class SyntheticArguments:
    """The planted task (`build_spectral_task`) and the experiment's seeds, ablation and probes."""

    _argument_group_name = "task (build_spectral_task) and experiment"

    strengths: list[float] = field(default_factory=lambda: list(DEFAULT_STRENGTHS))
    num_train: int = 4000
    num_validation: int = 1000
    task_seed: int = field(default=0, metadata={"help": "seed of the generated task"})
    seeds: list[int] = field(
        default_factory=lambda: [0, 1, 2],
        metadata={"help": "model initialisation / data-order seeds (same data)"},
    )
    ablation: bool = field(
        default=True,
        metadata={"help": "also run the first seed with growth from step 0 (--no_ablation: not)"},
    )
    probe_rows: int = field(default=256, metadata={"help": "validation rows of the probes"})
    collapse_ratio: float = field(
        default=0.01,
        metadata={"help": "collapsed: final min prototype distance < ratio x the head's first one"},
    )


def parse_args(argv: list[str] | None, description: str | None = None) -> argparse.Namespace:
    """`exp_synthetic.py`'s flags: the planted task's, the experiment's and the shared ones (its defaults;
    `--output_dir results/synthetic`: the committed run)."""
    parser = experiment_parser(
        SyntheticArguments,
        description=description,
        max_steps=2000,
        eval_steps=500,
        output_dir=str(REPO_ROOT / "outputs" / "synthetic"),
    )
    args = parser.parse_args(argv)
    check_experiment_arguments(parser, args)
    if args.probe_rows < 2 or args.probe_rows > args.num_validation:
        parser.error(
            f"--probe_rows must lie in [2, --num_validation={args.num_validation}], got {args.probe_rows}"
        )
    if not 0 < args.collapse_ratio < 1:
        parser.error(f"--collapse_ratio must lie in (0, 1), got {args.collapse_ratio}")
    return args
