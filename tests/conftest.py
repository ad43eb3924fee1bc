"""Shared pytest fixtures: the read-only data folder beside the checkout.

`scripts/` goes on `sys.path`, as it is for a script run from there, so tests import the experiment
scripts' shared `harness` package as the scripts do.

Without a GPU, Triton kernels run only in Triton's interpreter, which `triton.jit` selects when a kernel
is defined, i.e. when a kernel module (`models/ddl_mhc/ops/*/triton.py`) is first imported; setting
TRITON_INTERPRET=1 here, before any test module imports them, makes tests/test_triton_kernels.py run them
on CPU tensors.
"""

import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# pytest-xdist workers (`-n N`) share the cores: each takes its part of torch's intra-op threads, as
# torchrun's processes do, instead of every worker starting one thread per core.
XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if XDIST_WORKERS > 1:
    torch.set_num_threads(max(1, torch.get_num_threads() // XDIST_WORKERS))

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
sys.path.insert(0, str(REPO_ROOT / "scripts"))


@pytest.fixture
def shared_data() -> Path:
    """`../shared/data`; tests that need it skip when a user's checkout has no such folder."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent (only CI and developer machines have it)")
    return SHARED_DATA


@pytest.fixture(scope="module")
def single_thread():
    """One intra-op thread for a module of tiny-model tests: more threads only add synchronisation (and
    stall on a shared CPU). Modules opt in with `pytestmark = pytest.mark.usefixtures("single_thread")`."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def restore_torch_threads():
    """The scripts set torch's global thread count (`--threads`): restore it after each test. Modules opt in
    with `pytestmark = pytest.mark.usefixtures("restore_torch_threads")`."""
    previous = torch.get_num_threads()
    yield
    torch.set_num_threads(previous)
