"""geoformers.configuration"""

from .ddcl_incrt import DDCLIncrtConfig
from .ddl_mhc import DDLmHCConfig

__all__ = [
    "DDCLIncrtConfig",
    "DDLmHCConfig",
]
