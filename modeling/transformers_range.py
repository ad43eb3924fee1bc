"""The transformers releases the models' code supports (docs/versions.md, 'Supported ranges'), checked on
import: `import geoformers` imports this module first, and every code file a saved folder ships imports its
copy before anything else (`hub_code`). Outside the range the import fails with one ImportError naming the
installed and the required versions (transformers' `require_version`), not on a moved transformers internal.
"""

from transformers.utils.versions import require_version

# pyproject.toml's transformers bound (tests/test_dependency_bounds.py keeps the two equal)
TRANSFORMERS_REQUIREMENT = "transformers>=5.24,<6"

require_version(
    TRANSFORMERS_REQUIREMENT,
    f"geoformers' model code (the package, or the code files of a saved model folder) supports "
    f"{TRANSFORMERS_REQUIREMENT}; install a release in that range: pip install '{TRANSFORMERS_REQUIREMENT}'",
)
