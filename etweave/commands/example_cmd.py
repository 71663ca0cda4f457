"""`etweave example`: convert the real 2-rank run bundled with the package and print the audit summary."""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path

from etweave.report import summary
from etweave.run import convert_run


def example_dir() -> Path:
    return Path(str(resources.files("etweave") / "examples" / "gloo_w2"))


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("example", help="convert the bundled example run and print the audit summary")
    p.add_argument("-o", "--output", type=Path, default=Path("etweave-example"),
                   help="output folder (default: ./etweave-example)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    src = example_dir()
    print(f"converting the bundled example run {src} (collected by examples/train_gloo.py)")
    result = convert_run(src, args.output, jobs=1)
    for rank_report in result.report["ranks"].values():
        print(summary(rank_report))
    cross = result.report["cross_rank"]
    print(f"cross-rank check: {'consistent' if cross['consistent'] else 'NOT consistent'}; "
          f"wrote {args.output}/trace.<rank>.et, comm_group.json, report.json")
    print(f"next: etweave check {args.output}; etweave simulate {args.output}")
    return 0
