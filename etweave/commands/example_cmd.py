"""`etweave example`: convert the real 2-rank run bundled with the package and print the audit summary."""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path

from etweave.convert import convert, write_json
from etweave.report import summary


def example_dir() -> Path:
    return Path(str(resources.files("etweave") / "examples" / "dist_ddp_w2"))


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("example", help="convert the bundled example run and print the audit summary")
    p.add_argument("-o", "--output", type=Path, default=Path("etweave-example"),
                   help="output folder (default: ./etweave-example)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    src = example_dir()
    out: Path = args.output
    out.mkdir(parents=True, exist_ok=True)
    reports = {}
    for rank_dir in sorted(src.glob("rank*")):
        rank = int(rank_dir.name[4:])
        result = convert(rank_dir / "host.json.gz", rank_dir / "kineto.json.gz", out / f"trace.{rank}.et", rank=rank)
        reports[str(rank)] = result.report
        print(summary(result.report))
    write_json(out / "report.json", reports)
    print(f"wrote {len(reports)} .et files and report.json to {out}/ (from {src})")
    return 0
