"""No committed file names a folder of the machine it was written on (a home, a work or temp folder): results,
docs and scripts refer to the checkout by repository-relative paths and to data by name."""

import re
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# A path rooted at one of these folders, not preceded by a word character (so URLs such as
# https://host/home/ do not count), or a Windows user folder.
MACHINE_PATH = re.compile(
    r"(?<![\w.~-])/(?:work|home|tmp|Users|root|mnt|scratch|private/var)/"
    r"|[A-Za-z]:\\Users\\"
)


def committed_text_files() -> list[Path]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of committed files")
    files = [REPO_ROOT / name for name in listed.stdout.decode().split("\0") if name]
    return [path for path in files if path.is_file() and b"\0" not in path.read_bytes()[:8192]]


SLASH = "/"  # the examples are assembled, so that this file does not hold what it looks for


@pytest.mark.parametrize(
    "text",
    [
        f"{SLASH}home/alice/x",
        f"see {SLASH}tmp/run",
        f'"{SLASH}work/main/out"',
        f"{SLASH}Users/bob/",
        "C:" + "\\Users\\bob\\data",
    ],
)
def test_the_pattern_catches_machine_paths(text):
    assert MACHINE_PATH.search(text)


@pytest.mark.parametrize(
    "text",
    [
        "https://huggingface.co/home/x",
        "outputs/tmp/run",
        "../shared/data/sst2",
        "results/work/x.json",
        "~/tmp/x",
    ],
)
def test_the_pattern_passes_relative_paths_and_urls(text):
    assert not MACHINE_PATH.search(text)


def test_no_committed_file_names_a_machine_path():
    offenders = []
    for path in committed_text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        offenders += [
            f"{path.relative_to(REPO_ROOT)}:{text.count(chr(10), 0, match.start()) + 1}: "
            f"{text[match.start() : match.start() + 60]!r}"
            for match in MACHINE_PATH.finditer(text)
        ]
    assert not offenders, "absolute paths of a machine in committed files:\n" + "\n".join(offenders[:20])
