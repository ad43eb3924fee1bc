"""transformers' own common model tests (`tests/test_modeling_common.py` of the installed version), for the
test modules that run them against the geoformers models.

The test files are not in the transformers wheel: they are taken from the source distribution of the
installed version at test time (`pip download transformers==<version> --no-binary :all:`) into a cache
folder (`GEOFORMERS_TRANSFORMERS_TESTS` names one already holding `test_modeling_common.py`), never copied
into this repository. The sdist ships only the top level of `tests/`: it lacks `tests/models`,
`tests/exporters` and `tests/generation`, the last two imported by `test_modeling_common.py`, so their
mixins are replaced by empty classes.
"""

import importlib
import importlib.util
import os
import subprocess
import sys
import tarfile
import tempfile
import types
from pathlib import Path

import pytest
import transformers

PACKAGE = "transformers_common_tests"  # the sdist's tests/ folder, imported under this name


def _common_tests_folder() -> Path:
    """A folder holding transformers' tests/test_modeling_common.py for the installed version, or skip."""
    version = transformers.__version__
    given = os.environ.get("GEOFORMERS_TRANSFORMERS_TESTS")
    if given:
        folder = Path(given)
        if not (folder / "test_modeling_common.py").is_file():
            pytest.skip(f"GEOFORMERS_TRANSFORMERS_TESTS={given} holds no test_modeling_common.py",
                        allow_module_level=True)
        return folder
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    folder = cache / "geoformers" / f"transformers-{version}-tests"
    if (folder / "test_modeling_common.py").is_file():
        return folder
    with tempfile.TemporaryDirectory() as download:
        command = [sys.executable, "-m", "pip", "download", f"transformers=={version}", "--no-binary",
                   ":all:", "--no-deps", "--quiet", "-d", download]
        try:
            subprocess.run(command, check=True, capture_output=True, timeout=300)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as error:
            pytest.skip(f"cannot download the transformers {version} sdist for its common tests: {error}",
                        allow_module_level=True)
        (archive,) = Path(download).glob("transformers-*.tar.gz")
        prefix = f"transformers-{version}/tests/"
        with tarfile.open(archive) as sdist:
            members = [m for m in sdist.getmembers() if m.name.startswith(prefix) and m.name.count("/") == 2]
            for member in members:
                member.name = member.name[len(prefix):]
            partial = folder.with_name(folder.name + ".partial")
            sdist.extractall(partial, members=members, filter="data")
        partial.rename(folder)
    return folder


def import_modeling_common() -> types.ModuleType:
    """transformers' `test_modeling_common` module (`ModelTesterMixin`, `ids_tensor`, ...), or skip."""
    if importlib.util.find_spec("parameterized") is None:
        pytest.skip("transformers' common tests need the `parameterized` package (pip install parameterized)",
                    allow_module_level=True)
    if f"{PACKAGE}.test_modeling_common" in sys.modules:
        return sys.modules[f"{PACKAGE}.test_modeling_common"]
    folder = _common_tests_folder()
    package = types.ModuleType(PACKAGE)
    package.__path__ = [str(folder)]
    sys.modules[PACKAGE] = package
    for name, mixin in (("exporters.test_export", "ExportTesterMixin"), ("generation.test_utils",
                                                                       "GenerationTesterMixin")):
        parent = name.split(".")[0]
        stub = types.ModuleType(f"{PACKAGE}.{name}")
        setattr(stub, mixin, type(mixin, (), {}))
        sys.modules.setdefault(f"{PACKAGE}.{parent}", types.ModuleType(f"{PACKAGE}.{parent}"))
        sys.modules[f"{PACKAGE}.{name}"] = stub
    return importlib.import_module(f"{PACKAGE}.test_modeling_common")
