"""geoformers.configuration"""

from .ddcl_incrt import DDCLIncrtConfig

__all__ = [
    "DDCLIncrtConfig",
]
