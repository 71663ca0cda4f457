"""`etweave example`: convert the real 2-rank run bundled with the package and print the audit summary."""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path

from etweave.commands import convert_run_cmd


def example_dir() -> Path:
    return Path(str(resources.files("etweave") / "examples" / "dist_ddp_w2"))


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("example", help="convert the bundled example run and print the audit summary")
    p.add_argument("-o", "--output", type=Path, default=Path("etweave-example"),
                   help="output folder (default: ./etweave-example)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    src = example_dir()
    print(f"converting the bundled example run {src}")
    run_args = argparse.Namespace(run_dir=src, output=args.output, prefix="trace", allow_mismatch=False,
                                  jobs=1, scheduler=None, quiet=False)
    code = convert_run_cmd.run(run_args)
    print(f"check the result with: etweave check {args.output}; replay it with: etweave simulate {args.output}")
    return code
