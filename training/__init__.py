"""geoformers.training: Trainer callbacks (INCRT head growth, hyper-connection diagnostics, complete
checkpoints), optimizer groups, data builders, metrics. The names load on first access (PEP 562): importing a
callback does not load `datasets`."""

import importlib
from typing import TYPE_CHECKING

# eager: the function shares its module's name, and a lazy name would be shadowed by the submodule once
# anything imports geoformers.training.hc_diagnostics (it loads nothing heavy)
from geoformers.training.hc_diagnostics import HyperConnectionDiagnosticsCallback, hc_diagnostics

if TYPE_CHECKING:
    from geoformers.training.checkpoints import (
        CompleteCheckpointsCallback,
        checkpoint_problem,
        latest_complete_checkpoint,
    )
    from geoformers.training.data import causal_lm_blocks, encode_dataset, load_sst2
    from geoformers.training.growth import IncrtGrowthCallback, plot_growth_history
    from geoformers.training.optim import make_optimizer, parameter_groups, sync_optimizer_with_model
    from geoformers.training.reporting import report_callback_metrics
    from geoformers.training.resume import resume_growth_training
    from geoformers.training.synthetic_tasks import (
        build_cov2_variant_task,
        build_majority_relations_task,
        build_nonstationary_stream,
        build_spectral_task,
        task_spec,
    )

# name -> the module that defines it
_LAZY = {
    "CompleteCheckpointsCallback": "geoformers.training.checkpoints",
    "IncrtGrowthCallback": "geoformers.training.growth",
    "build_cov2_variant_task": "geoformers.training.synthetic_tasks",
    "build_majority_relations_task": "geoformers.training.synthetic_tasks",
    "build_nonstationary_stream": "geoformers.training.synthetic_tasks",
    "build_spectral_task": "geoformers.training.synthetic_tasks",
    "causal_lm_blocks": "geoformers.training.data",
    "checkpoint_problem": "geoformers.training.checkpoints",
    "encode_dataset": "geoformers.training.data",
    "latest_complete_checkpoint": "geoformers.training.checkpoints",
    "load_sst2": "geoformers.training.data",
    "make_optimizer": "geoformers.training.optim",
    "parameter_groups": "geoformers.training.optim",
    "plot_growth_history": "geoformers.training.growth",
    "report_callback_metrics": "geoformers.training.reporting",
    "resume_growth_training": "geoformers.training.resume",
    "sync_optimizer_with_model": "geoformers.training.optim",
    "task_spec": "geoformers.training.synthetic_tasks",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "CompleteCheckpointsCallback",
    "HyperConnectionDiagnosticsCallback",
    "IncrtGrowthCallback",
    "build_cov2_variant_task",
    "build_majority_relations_task",
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
    "report_callback_metrics",
    "resume_growth_training",
    "sync_optimizer_with_model",
    "task_spec",
]
