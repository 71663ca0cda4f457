"""The one error type for bad input: the CLI prints it as one line and exits 2."""

from __future__ import annotations

from pathlib import Path


class BadInput(Exception):
    """Input the user gave us is unusable; `where` names the file, the message says what is wrong."""

    def __init__(self, where: Path | str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = str(where)
        self.problem = problem

    def __reduce__(self) -> tuple[type[BadInput], tuple[str, str]]:
        # pickled as its two arguments (an exception pickles its message alone by default): a worker process's
        # BadInput reaches the parent as raised
        return type(self), (self.where, self.problem)


class CheckFailed(Exception):
    """A check or consistency violation (exit code 3)."""
