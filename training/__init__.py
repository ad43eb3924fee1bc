"""geoformers.training: Trainer callbacks (INCRT head growth, hyper-connection diagnostics), optimizer groups,
data builders, metrics."""

from geoformers.training.checkpoints import checkpoint_problem, latest_complete_checkpoint
from geoformers.training.growth import IncrtGrowthCallback, plot_growth_history, resume_growth_training
from geoformers.training.hc_diagnostics import HyperConnectionDiagnosticsCallback, hc_diagnostics
from geoformers.training.hc_optim import hc_parameter_groups, make_ddl_mhc_optimizer
from geoformers.training.optim import growth_parameter_groups, make_optimizer, sync_optimizer_with_model

__all__ = [
    "HyperConnectionDiagnosticsCallback",
    "IncrtGrowthCallback",
    "checkpoint_problem",
    "growth_parameter_groups",
    "hc_diagnostics",
    "hc_parameter_groups",
    "latest_complete_checkpoint",
    "make_ddl_mhc_optimizer",
    "make_optimizer",
    "plot_growth_history",
    "resume_growth_training",
    "sync_optimizer_with_model",
]
