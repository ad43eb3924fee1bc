"""geoformers: transformers whose structure comes from geometry (see docs in README.md)."""

__version__ = "0.1.0"
