"""geoformers.configuration"""

from geoformers.configuration.ddcl_incrt import DDCLIncrtConfig
from geoformers.configuration.ddl_mhc import DDLmHCConfig

__all__ = [
    "DDCLIncrtConfig",
    "DDLmHCConfig",
]
