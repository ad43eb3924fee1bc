"""geoformers.training: Trainer callbacks (INCRT head growth, hyper-connection diagnostics), optimizer groups,
data builders, metrics."""

from geoformers.training.checkpoints import checkpoint_problem, latest_complete_checkpoint
from geoformers.training.data import causal_lm_blocks, encode_dataset, load_sst2
from geoformers.training.growth import IncrtGrowthCallback, plot_growth_history
from geoformers.training.hc_diagnostics import HyperConnectionDiagnosticsCallback, hc_diagnostics
from geoformers.training.optim import make_optimizer, parameter_groups, sync_optimizer_with_model
from geoformers.training.resume import resume_growth_training
from geoformers.training.synthetic_tasks import (
    build_cov2_variant_task,
    build_nonstationary_stream,
    build_spectral_task,
    task_spec,
)

__all__ = [
    "HyperConnectionDiagnosticsCallback",
    "IncrtGrowthCallback",
    "build_cov2_variant_task",
    "build_nonstationary_stream",
    "build_spectral_task",
    "causal_lm_blocks",
    "checkpoint_problem",
    "encode_dataset",
    "hc_diagnostics",
    "latest_complete_checkpoint",
    "load_sst2",
    "make_optimizer",
    "parameter_groups",
    "plot_growth_history",
    "resume_growth_training",
    "sync_optimizer_with_model",
    "task_spec",
]
