"""etweave: lossless conversion of PyTorch host execution traces and Kineto traces to Chakra .et files."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from etweave.version import __version__

_API = ("Simulation", "convert_pair", "convert_run", "example_run_dir", "simulate_files")
__all__ = ["Simulation", "__version__", "convert_pair", "convert_run", "example_run_dir", "simulate_files"]

if TYPE_CHECKING:
    from etweave.api import Simulation, convert_pair, convert_run, example_run_dir, simulate_files


def __getattr__(name: str) -> Any:
    # Imported on first use: `import etweave` (and the CLI's start) stays cheap, and etweave.api may import the
    # modules that import `etweave.__version__` without a cycle.
    if name in _API:
        from etweave import api

        return getattr(api, name)
    raise AttributeError(f"module 'etweave' has no attribute {name!r}")
