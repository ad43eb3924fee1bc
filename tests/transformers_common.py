"""transformers' own common tests (`tests/test_modeling_common.py`, `tests/test_configuration_common.py` of
the installed version), for the test modules that run them, unmodified, against the geoformers models.

The test files are not in the transformers wheel. `GEOFORMERS_TRANSFORMERS_TESTS` may name a `tests/`
folder of a transformers checkout at the installed version; otherwise the top level of `tests/` is taken
from the source distribution (`pip download transformers==<version> --no-binary :all:`, from the package
index) into a cache folder on first use. Nothing of it is copied into this repository.

The sdist ships only the top level of `tests/`: it lacks `tests/generation`, `tests/exporters`,
`tests/pipelines` and `tests/utils`, so transformers' `GenerationTesterMixin`, `ExportTesterMixin` and
`PipelineTesterMixin` (`MIXINS`) cannot run. `test_modeling_common` imports the first two by name: for each
missing one its module is registered holding an empty class named `Absent<mixin>`, which no test class
inherits as the mixin. The test modules inherit the real mixins that are there (`present_mixins`) and report
each missing one as a skipped test naming the missing folder (`mixin_test`); transformers' own tests that
check for a mixin are skipped with the same reason (`skip_if_absent`). With a checkout's `tests/` folder
the real mixins run. `ConfigTester` is in the sdist and runs; of `tests/utils` it reads one dict of
arguments, given here (`COMMON_CONFIG_ARGUMENTS`) when absent.
"""

import importlib
import importlib.util
import os
import shutil
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

# transformers' test mixins outside the top level of tests/: (module, what of tests/ it needs)
MIXINS = {
    "GenerationTesterMixin": ("generation.test_utils", ("generation/test_utils.py",)),
    "ExportTesterMixin": ("exporters.test_export", ("exporters/test_export.py",)),
    # its module is at the top level, but it reads utils/tiny_model_summary.json when imported and runs
    # the task tests of pipelines/
    "PipelineTesterMixin": ("test_pipeline_mixin", ("pipelines/", "utils/tiny_model_summary.json")),
}


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
    if not (folder / "test_modeling_common.py").is_file():
        _extract_sdist_tests(version, folder)
    return folder


def _extract_sdist_tests(version: str, folder: Path) -> None:
    """Download the transformers `version` sdist and extract the top level of its tests/ as `folder`, or
    skip. pytest-xdist workers collect at the same time: each extracts into a folder of its own and renames
    it into place; the first rename wins and the others remove theirs."""
    folder.parent.mkdir(parents=True, exist_ok=True)
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
        partial = Path(tempfile.mkdtemp(prefix=f"{folder.name}.partial-", dir=folder.parent))
        with tarfile.open(archive) as sdist:
            members = [m for m in sdist.getmembers() if m.name.startswith(prefix) and m.name.count("/") == 2]
            for member in members:
                member.name = member.name[len(prefix) :]
            sdist.extractall(partial, members=members, filter="data")
    try:
        partial.rename(folder)
    except OSError:
        if not (folder / "test_modeling_common.py").is_file():
            raise
        shutil.rmtree(partial)


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


def missing(mixin: str) -> list[str]:
    """The parts of tests/ that transformers' `mixin` needs and the folder in use lacks."""
    folder = _package()
    return [part for part in MIXINS[mixin][1] if not (folder / part).exists()]


def absent_reason(mixin: str, covered_by: str) -> str:
    """Why transformers' `mixin` does not run here, and which project tests check what it would."""
    lacking = " and ".join(f"tests/{part}" for part in missing(mixin))
    return (
        f"transformers' {mixin} is not run: it needs {lacking}, which {_package()} lacks (the transformers "
        f"{transformers.__version__} sdist ships only the top level of tests/; set "
        "GEOFORMERS_TRANSFORMERS_TESTS to a checkout's tests/ folder to run it); covered here by "
        f"{covered_by}"
    )


def _register_absent(mixin: str) -> None:
    """Make `PACKAGE.<module of mixin>` importable when its file is missing: a module holding an empty class
    `Absent<mixin>` under the mixin's name, for `test_modeling_common`'s import; no test class inherits it as
    the mixin (`present_mixins` leaves it out)."""
    module = f"{PACKAGE}.{MIXINS[mixin][0]}"
    if module in sys.modules or not missing(mixin):
        return
    parent = module.rpartition(".")[0]
    sys.modules.setdefault(parent, types.ModuleType(parent))
    stand_in = types.ModuleType(module)
    doc = f"transformers' {mixin} is absent ({', '.join(missing(mixin))} missing): no test of it runs."
    setattr(stand_in, mixin, type(f"Absent{mixin}", (), {"__doc__": doc, "__module__": module}))
    sys.modules[module] = stand_in


def import_modeling_common() -> types.ModuleType:
    """transformers' `test_modeling_common` module (`ModelTesterMixin`, `ids_tensor`, ...), or skip."""
    _register_absent("GenerationTesterMixin")
    _register_absent("ExportTesterMixin")
    return importlib.import_module(f"{PACKAGE}.test_modeling_common")


def present_mixins(*mixins: str) -> tuple[type, ...]:
    """transformers' real test mixins among `mixins` whose files the folder in use has, for a test class's
    bases."""
    return tuple(
        getattr(importlib.import_module(f"{PACKAGE}.{MIXINS[name][0]}"), name)
        for name in mixins
        if not missing(name)
    )


def skip_if_absent(testcase: unittest.TestCase, mixin: str, covered_by: str) -> None:
    """Skip a transformers test that checks for `mixin` (its inheritance) when the mixin is absent."""
    if missing(mixin):
        testcase.skipTest(absent_reason(mixin, covered_by))


def mixin_test(test_class: type, covered_by: dict[str, str]):
    """A test, one case per transformers mixin in `covered_by` (mixin -> the project tests that check what
    it checks): `test_class` inherits the real mixin, so its tests run; skipped with `absent_reason` when the
    folder in use lacks the mixin's files."""

    @pytest.mark.parametrize("mixin", sorted(covered_by))
    def test_transformers_mixin(mixin):
        if missing(mixin):
            pytest.skip(absent_reason(mixin, covered_by[mixin]))
        (real,) = present_mixins(mixin)
        assert issubclass(test_class, real), f"{test_class.__name__} does not inherit transformers' {mixin}"

    return test_transformers_mixin


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
