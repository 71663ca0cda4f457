"""Subcommands. Each module has `register(subparsers)`, which adds its parser and sets `run=` to a function
`run(args) -> int` returning the exit code. Add a command by adding its module to COMMANDS."""

from __future__ import annotations

from types import ModuleType

from etweave.commands import check_cmd, convert_cmd, convert_run_cmd, example_cmd, jsonize_cmd, simulate_cmd

COMMANDS: list[ModuleType] = [convert_cmd, convert_run_cmd, check_cmd, simulate_cmd, jsonize_cmd, example_cmd]
