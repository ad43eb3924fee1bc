"""torch's CPU threads for every script: one by default (docs/experiments.md, 'Threads').

torch starts one intra-op thread per core. The scripts' models are small: one thread runs a step about as
fast as several on an idle machine, and many times faster when another process keeps a core busy.
"""

import torch

DEFAULT_THREADS = 1
THREADS_HELP = (
    "torch CPU threads (default 1: fastest for small models and on a shared machine; 0: torch's default, "
    "one per core)"
)


def set_threads(threads: int) -> None:
    """torch.set_num_threads(threads); 0 leaves torch's default."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ValueError(f"--threads must be an int >= 0, got {threads!r}")
    if threads:
        torch.set_num_threads(threads)
