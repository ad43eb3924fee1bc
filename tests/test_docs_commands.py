"""Every command that README.md, docs/ and model_cards/ give runs as written in the project's environment:
each `python scripts/X.py ...` script answers `--help` (run in this interpreter, the environment's, in one
process: the scripts share their imports) and lists every flag the documented commands pass it; each
`bash scripts/dev.sh <command>` is one that dev.sh handles; and the README says how to use the environment."""

import contextlib
import io
import re
import runpy
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "model_cards").glob("*.md")),
]
COMMAND = re.compile(r"python3? scripts/(\w+\.py)([^`\n|]*)")
# a flag right after "=" (`--grown_flags TASK=--flag`) or inside quotes is another flag's value
FLAG = re.compile(r"(?<![\w=-])--([A-Za-z_][\w-]*)")
QUOTED = re.compile(r'"[^"\n]*"')

pytestmark = pytest.mark.usefixtures("restore_torch_threads")


def documented_commands() -> dict[str, dict[str, set[str]]]:
    """script -> flag -> the pages whose commands pass it (continued lines joined)."""
    commands = defaultdict(lambda: defaultdict(set))
    for page in PAGES:
        text = re.sub(r"\\\n\s*", " ", page.read_text(encoding="utf-8"))
        for script, arguments in COMMAND.findall(text):
            flags = commands[script]
            for flag in FLAG.findall(QUOTED.sub('""', arguments)):
                flags[flag].add(str(page.relative_to(ROOT)))
    return commands


def script_help(script: str, monkeypatch) -> str:
    """`python scripts/<script> --help` in this process: what it prints; it must exit with status 0."""
    path = ROOT / "scripts" / script
    assert path.is_file(), f"the docs name scripts/{script}, which does not exist"
    monkeypatch.setattr(sys, "argv", [str(path), "--help"])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(SystemExit) as exit_status:
        runpy.run_path(str(path), run_name="__main__")
    assert exit_status.value.code in (0, None), (
        f"scripts/{script} --help exited with {exit_status.value.code}"
    )
    return printed.getvalue()


def test_the_docs_name_the_scripts():
    commands = documented_commands()
    assert {"grow_demo.py", "train_causal_lm.py", "convert_llama.py", "finetune_lora.py"} <= set(commands)
    assert "data" in commands["exp_upcycle_pretrained.py"]  # flags of continued lines are read too


def test_every_documented_script_answers_help_and_takes_the_documented_flags(monkeypatch):
    missing = []
    for script, flags in sorted(documented_commands().items()):
        options = set(FLAG.findall(script_help(script, monkeypatch)))
        assert "help" in options, f"scripts/{script} --help printed no usage"
        missing += [
            f"{script} --{flag} (in {', '.join(sorted(pages))})"
            for flag, pages in flags.items()
            if flag not in options
        ]
    assert not missing, f"documented flags the scripts do not take: {missing}"


def test_documented_dev_sh_commands_exist():
    handled = set(re.findall(r"^\s+(\w+)\)", (ROOT / "scripts" / "dev.sh").read_text(), flags=re.MULTILINE))
    for page in PAGES:
        for command in re.findall(r"bash scripts/dev\.sh (\w+)", page.read_text(encoding="utf-8")):
            assert command in handled, f"{page.relative_to(ROOT)}: dev.sh has no {command!r} command"
    assert (ROOT / "scripts" / "gpu_benchmark.sh").is_file()


def test_the_readme_says_how_to_use_the_environment():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "source .venv/bin/activate" in readme and ".venv/bin/python scripts/" in readme
