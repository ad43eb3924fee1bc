"""The planted spectral task of `exp_synthetic.py` (docs/experiments.md, 'exp_synthetic.py'): its flags,
shared with the sweeps that rerun its recipe (`exp_grown_vs_swept.py`)."""

from __future__ import annotations

import argparse

from geoformers.training.synthetic_tasks import DEFAULT_STRENGTHS

from harness.flags import add_experiment_arguments, check_experiment_arguments
from harness.results import REPO_ROOT


def parse_args(argv: list[str] | None, description: str | None = None) -> argparse.Namespace:
    """`exp_synthetic.py`'s flags: the planted task's, the experiment's and the shared ones (its defaults)."""
    parser = argparse.ArgumentParser(description=description)
    task = parser.add_argument_group("task (build_spectral_task)")
    task.add_argument("--strengths", type=float, nargs="+", default=list(DEFAULT_STRENGTHS))
    task.add_argument("--num_train", type=int, default=4000)
    task.add_argument("--num_validation", type=int, default=1000)
    task.add_argument("--data_seed", type=int, default=0)
    experiment = parser.add_argument_group("experiment")
    experiment.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[0, 1, 2],
        help="model initialisation / data-order seeds (same data)",
    )
    experiment.add_argument(
        "--ablation",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the first seed with growth from step 0",
    )
    experiment.add_argument("--probe_rows", type=int, default=256, help="validation rows of the probes")
    experiment.add_argument(
        "--collapse_ratio",
        type=float,
        default=0.01,
        help="collapsed: final min prototype distance < ratio x the head's first one",
    )
    experiment.add_argument(
        "--output_dir",
        default=str(REPO_ROOT / "outputs" / "synthetic"),
        help="results/synthetic: the committed run",
    )
    add_experiment_arguments(parser)
    parser.set_defaults(max_steps=2000, eval_steps=500)
    args = parser.parse_args(argv)
    check_experiment_arguments(parser, args)
    if args.probe_rows < 2 or args.probe_rows > args.num_validation:
        parser.error(
            f"--probe_rows must lie in [2, --num_validation={args.num_validation}], got {args.probe_rows}"
        )
    if not 0 < args.collapse_ratio < 1:
        parser.error(f"--collapse_ratio must lie in (0, 1), got {args.collapse_ratio}")
    return args
