"""transformers' own common tests (`tests/test_modeling_common.py`, `tests/test_configuration_common.py`,
`tests/test_pipeline_mixin.py` of the installed version), for the test modules that run them, unmodified,
against the geoformers models.

The test files are not in the transformers wheel. `GEOFORMERS_TRANSFORMERS_TESTS` may name a `tests/`
folder of a transformers checkout at the installed version; otherwise the top level of `tests/` is taken
from the source distribution (`pip download transformers==<version> --no-binary :all:`) into a cache folder
at test time. Nothing of it is copied into this repository.

The sdist ships only the top level of `tests/`: it lacks `tests/generation`, `tests/exporters`,
`tests/pipelines` and `tests/utils`. Each mixin that lives there (or imports from there) is then replaced by
`absent_mixin`: a mixin with one test that is skipped, naming the missing folder and the project tests that
cover what the mixin checks. With a checkout's `tests/` folder the real mixins run. `ConfigTester` is in the
sdist and runs; of `tests/utils` it reads one dict of arguments, given here (`COMMON_CONFIG_ARGUMENTS`) when
absent.
"""

import importlib
import importlib.util
import os
import subprocess
import sys
import tarfile
import tempfile
import types
import unittest
from pathlib import Path

import pytest
import transformers

PACKAGE = "transformers_common_tests"  # the tests/ folder, imported under this name


def _common_tests_folder() -> Path:
    """A folder holding transformers' tests/test_modeling_common.py for the installed version, or skip."""
    version = transformers.__version__
    given = os.environ.get("GEOFORMERS_TRANSFORMERS_TESTS")
    if given:
        folder = Path(given)
        if not (folder / "test_modeling_common.py").is_file():
            pytest.skip(
                f"GEOFORMERS_TRANSFORMERS_TESTS={given} holds no test_modeling_common.py",
                allow_module_level=True,
            )
        return folder
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    folder = cache / "geoformers" / f"transformers-{version}-tests"
    if (folder / "test_modeling_common.py").is_file():
        return folder
    with tempfile.TemporaryDirectory() as download:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            f"transformers=={version}",
            "--no-binary",
            ":all:",
            "--no-deps",
            "--quiet",
            "-d",
            download,
        ]
        try:
            subprocess.run(command, check=True, capture_output=True, timeout=300)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as error:
            pytest.skip(
                f"cannot download the transformers {version} sdist for its common tests: {error}",
                allow_module_level=True,
            )
        (archive,) = Path(download).glob("transformers-*.tar.gz")
        prefix = f"transformers-{version}/tests/"
        with tarfile.open(archive) as sdist:
            members = [m for m in sdist.getmembers() if m.name.startswith(prefix) and m.name.count("/") == 2]
            for member in members:
                member.name = member.name[len(prefix) :]
            partial = folder.with_name(folder.name + ".partial")
            sdist.extractall(partial, members=members, filter="data")
        partial.rename(folder)
    return folder


def absent_mixin(name: str, missing: str, covered_by: str) -> type:
    """A stand-in for transformers' test mixin `name`, which lives in (or imports) `missing`, a part of
    transformers' tests/ that the folder in use lacks: its one test is skipped with that reason."""

    def test_mixin_is_absent(self):
        self.skipTest(
            f"transformers' {name} needs tests/{missing}, which the transformers "
            f"{transformers.__version__} sdist does not ship (set GEOFORMERS_TRANSFORMERS_TESTS to "
            f"a checkout's tests/ folder to run it); covered here by {covered_by}"
        )

    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
    return type(name, (), {f"test_{snake}_is_absent": test_mixin_is_absent, "__module__": __name__})


def _package() -> Path:
    """The tests/ folder registered as package `PACKAGE` (once)."""
    if PACKAGE not in sys.modules:
        if importlib.util.find_spec("parameterized") is None:
            pytest.skip(
                "transformers' common tests need the `parameterized` package (pip install parameterized)",
                allow_module_level=True,
            )
        package = types.ModuleType(PACKAGE)
        package.__path__ = [str(_common_tests_folder())]
        sys.modules[PACKAGE] = package
    return Path(sys.modules[PACKAGE].__path__[0])


def _mixin_module(module: str, mixin: str, covered_by: str) -> None:
    """Make `PACKAGE.module` importable: the real file when the folder has it, else a module holding
    `absent_mixin(mixin, ...)`."""
    folder = _package()
    full = f"{PACKAGE}.{module}"
    if full in sys.modules or (folder / f"{module.replace('.', '/')}.py").is_file():
        return
    parent = module.rpartition(".")[0]
    sys.modules.setdefault(f"{PACKAGE}.{parent}", types.ModuleType(f"{PACKAGE}.{parent}"))
    stand_in = types.ModuleType(full)
    setattr(stand_in, mixin, absent_mixin(mixin, f"{parent}/", covered_by))
    sys.modules[full] = stand_in


def import_modeling_common(generation_covered_by: str, export_covered_by: str) -> types.ModuleType:
    """transformers' `test_modeling_common` module (`ModelTesterMixin`, `ids_tensor`, ...), or skip. Its
    imports `GenerationTesterMixin` and `ExportTesterMixin` are the real ones or `absent_mixin`s naming the
    project tests given."""
    _mixin_module("generation.test_utils", "GenerationTesterMixin", generation_covered_by)
    _mixin_module("exporters.test_export", "ExportTesterMixin", export_covered_by)
    return importlib.import_module(f"{PACKAGE}.test_modeling_common")


def generation_tester_mixin() -> type:
    return importlib.import_module(f"{PACKAGE}.generation.test_utils").GenerationTesterMixin


def pipeline_tester_mixin(covered_by: str) -> type:
    """transformers' `PipelineTesterMixin` when `tests/pipelines` is there (its tests live in that folder),
    else an `absent_mixin`."""
    if (_package() / "pipelines").is_dir():
        return importlib.import_module(f"{PACKAGE}.test_pipeline_mixin").PipelineTesterMixin
    return absent_mixin("PipelineTesterMixin", "pipelines/", covered_by)


# What ConfigTester's `check_config_arguments_init` passes to a config and reads back: a value other than the
# default for each of `PreTrainedConfig`'s own arguments, the contents of transformers' `config_common_kwargs`
# in tests/utils/test_configuration_utils.py, which the sdist does not ship.
COMMON_CONFIG_ARGUMENTS = {
    "return_dict": False,
    "output_hidden_states": True,
    "output_attentions": True,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "architectures": ["BertModel"],
    "id2label": {0: "label"},
    "label2id": {"label": "0"},
    "problem_type": "regression",
}


def run_config_tests(testcase: unittest.TestCase, **tester_kwargs) -> None:
    """transformers' `ConfigTester(testcase, **tester_kwargs).run_common_tests()`. Its module imports
    `config_common_kwargs` from tests/utils/test_configuration_utils.py; where the folder in use lacks that
    file (the sdist), the import finds `COMMON_CONFIG_ARGUMENTS` under that name. The module also loads the
    folder's `__init__.py` by path (`direct_transformers_import`), an empty file the sdist leaves out."""
    folder = _package()
    (folder / "__init__.py").touch(exist_ok=True)
    if not (folder / "utils" / "test_configuration_utils.py").is_file():
        utils = sys.modules.setdefault(f"{PACKAGE}.utils", types.ModuleType(f"{PACKAGE}.utils"))
        arguments = types.ModuleType(f"{PACKAGE}.utils.test_configuration_utils")
        arguments.config_common_kwargs = COMMON_CONFIG_ARGUMENTS
        sys.modules.setdefault(arguments.__name__, arguments)
        utils.test_configuration_utils = sys.modules[arguments.__name__]
    tester = importlib.import_module(f"{PACKAGE}.test_configuration_common").ConfigTester
    tester(testcase, **tester_kwargs).run_common_tests()


def list_in_auto_mappings(testcase: unittest.TestCase, model_type: str, *listings: tuple[dict, str]) -> None:
    """List the model's classes in transformers' `*_MAPPING_NAMES` tables (`listings`: (table, class name)
    pairs), where an in-tree model is listed and where the mixins look up which class is a base model, a
    causal LM, a sequence classifier; `AutoModel.register` fills only the lazy mappings. Undone after the
    test."""
    for table, class_name in listings:
        previous = table.get(model_type)
        table[model_type] = class_name
        if previous is None:
            testcase.addCleanup(table.pop, model_type)
        else:
            testcase.addCleanup(table.__setitem__, model_type, previous)
