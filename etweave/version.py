"""etweave's version: one home, read by the package, the CLI and the metadata every output carries (kept equal to
pyproject.toml's `version`, which tests/test_packaging.py checks)."""

__version__ = "0.1.0"
