"""The command-line scripts as modules, for tests that call their functions (`scripts/` is on `sys.path`,
conftest.py)."""

import importlib.util
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str):
    """A fresh copy of `scripts/<name>`, registered in sys.modules so that its functions pickle (process
    pools)."""
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), SCRIPTS / name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
