"""Print pip constraints that pin each dependency of pyproject.toml with a lower bound to that bound
(`name==floor`): the minimum-versions environment of `bash scripts/dev.sh min` (docs/versions.md)."""

import re
import sys
from pathlib import Path

import tomllib

_REQUIREMENT = re.compile(r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?P<specifiers>[^;]*)")


def floors(pyproject: Path) -> dict[str, str]:
    """Dependency name -> its `>=` bound, for the runtime dependencies that have one."""
    found = {}
    for line in tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]:
        match = _REQUIREMENT.match(line)
        lower = re.search(r">=\s*([^,\s]+)", match["specifiers"])
        if lower:
            found[match["name"]] = lower[1]
    return found


if __name__ == "__main__":
    for name, floor in floors(Path(sys.argv[1])).items():
        print(f"{name}=={floor}")
