"""The transformers releases the models' code supports (docs/versions.md, 'Saved folders'), checked on import:
`import geoformers` imports this module first, and the files transformers loads first from a saved folder
(each model's configuration and modeling file) import its copy before anything else. Outside the range the
import fails with one ImportError naming the installed and the required versions, not on a moved transformers
internal. The check itself reads only `transformers.__version__` and `packaging` (a transformers dependency),
which no release moves."""

import transformers
from packaging.specifiers import SpecifierSet

# pyproject.toml's transformers bound (tests/test_dependency_bounds.py keeps the two equal)
TRANSFORMERS_REQUIREMENT = "transformers>=5.24,<6"

if not SpecifierSet(TRANSFORMERS_REQUIREMENT.removeprefix("transformers")).contains(
    transformers.__version__, prereleases=True
):
    raise ImportError(
        f"geoformers' model code (the package, or the code files of a saved model folder) supports "
        f"{TRANSFORMERS_REQUIREMENT}, but transformers {transformers.__version__} is installed; install a "
        f"release in that range: pip install '{TRANSFORMERS_REQUIREMENT}'"
    )
