"""The package's version, in one place: `evolane.__version__`, ``evolane --version`` and the
distribution's metadata (``pyproject.toml`` reads it from here)."""

__version__ = "0.1.0"
