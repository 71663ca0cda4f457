"""Subcommands. Each module has `register(subparsers)`, which adds its parser and sets `run=` to a function
`run(args) -> int` returning the exit code. Add a command by adding its name and module to COMMAND_MODULES.

A module is imported only when its command runs (or the whole list is shown): `etweave convert` does not pay for
the replay's, the checker's or the whole-run modules' imports."""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

# command name (as the module registers it) -> its module, in the order `etweave --help` lists them
COMMAND_MODULES: dict[str, str] = {
    "convert": "etweave.commands.convert_cmd",
    "convert-run": "etweave.commands.convert_run_cmd",
    "check": "etweave.commands.check_cmd",
    "simulate": "etweave.commands.simulate_cmd",
    "jsonize": "etweave.commands.jsonize_cmd",
    "example": "etweave.commands.example_cmd",
}


def command_module(name: str) -> ModuleType:
    """The module of the command `name` (imported now)."""
    return import_module(COMMAND_MODULES[name])


def __getattr__(name: str) -> list[ModuleType]:
    if name == "COMMANDS":  # every command's module, imported
        return [command_module(command) for command in COMMAND_MODULES]
    raise AttributeError(f"module 'etweave.commands' has no attribute {name!r}")
