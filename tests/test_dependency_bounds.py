"""pyproject.toml's dependency bounds (docs/versions.md, 'Supported ranges'): the libraries the package
imports each have a lower bound, which the minimum-versions environment pins (`.ci/min_constraints.py`);
the transformers range is the one a saved folder's code checks; the installed versions are inside the
bounds."""

import importlib.util
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from geoformers.models.transformers_range import TRANSFORMERS_REQUIREMENT

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python >= 3.11's tomllib")

ROOT = Path(__file__).resolve().parents[1]
BOUNDED = (
    "torch",
    "transformers",
    "datasets",
    "accelerate",
    "peft",
    "huggingface-hub",
    "safetensors",
    "tokenizers",
)


def requirements() -> dict[str, Requirement]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return {(r := Requirement(line)).name: r for line in pyproject["project"]["dependencies"]}


def min_constraints():
    spec = importlib.util.spec_from_file_location("min_constraints", ROOT / ".ci" / "min_constraints.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_library_the_package_builds_on_has_one_lower_bound_and_the_min_environment_pins_it():
    declared = requirements()
    floors = {name: [s.version for s in declared[name].specifier if s.operator == ">="] for name in BOUNDED}
    assert all(len(bound) == 1 for bound in floors.values()), floors
    assert min_constraints().floors(ROOT / "pyproject.toml") == {
        name: bound[0] for name, bound in floors.items()
    }


def test_the_transformers_range_a_saved_folder_checks_is_pyprojects():
    assert Requirement(TRANSFORMERS_REQUIREMENT).specifier == requirements()["transformers"].specifier


def test_the_installed_versions_are_inside_the_bounds():
    outside = {
        name: version(name)
        for name, requirement in requirements().items()
        if not requirement.specifier.contains(Version(version(name)).public, prereleases=True)
    }
    assert not outside, f"installed outside pyproject.toml's bounds: {outside}"


def test_a_floor_is_read_from_each_form_of_requirement(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\ndependencies = ["a>=1.2,<2", "b >= 0.3", "c", "d<4", "e[x]>=5; python_version>\'3\'"]\n'
    )
    assert min_constraints().floors(pyproject) == {"a": "1.2", "b": "0.3", "e": "5"}
