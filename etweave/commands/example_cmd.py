"""`etweave example`: convert the real 2-rank run bundled with the package and print the audit summary."""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path

from etweave.report import summary
from etweave.run import convert_run

HOW_TO_READ = """\
how to read it (README "Linking host ops to Kineto events", docs/OUTPUT.md "The audit report"):
  linked by rf_id: host ET ops were matched to Kineto events exactly, by Record function id ("alignment": by
    name order, for traces of separate sessions; "kineto": Kineto cpu ops stood in for a missing host ET;
    "none": no Kineto trace was given, so nothing is measured)
  host_ops: ops of the host ET; cpu_ops: Kineto's cpu ops, "out" = those matched to a host op. host_ops is
    larger by the host ET's own records that Kineto never has (process and thread roots, process_group:init),
    kept unmeasured (attr linked false)
  in / out / left out: every input op is in the output or left out with a reason (report.json)"""


def example_dir() -> Path:
    return Path(str(resources.files("etweave") / "examples" / "gloo_w2"))


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("example", help="convert the bundled example run and print the audit summary")
    p.add_argument("-o", "--output", type=Path, default=Path("etweave-example"),
                   help="output folder (default: ./etweave-example)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    src = example_dir()
    print(f"converting the bundled example run {src} (2 CPU ranks, gloo; recorded with etweave.collect by "
          "examples/train_gloo.py of etweave's source repository)")
    result = convert_run(src, args.output, jobs=1, progress=True)
    for rank_report in result.report["ranks"].values():
        print(summary(rank_report))
    cross = result.report["cross_rank"]
    print(f"cross-rank check: {'consistent' if cross['consistent'] else 'NOT consistent'}; "
          f"wrote {args.output}/trace.<rank>.et, comm_group.json, report.json")
    print(HOW_TO_READ)
    print(f"next: etweave check {args.output}; etweave simulate {args.output}")
    return 0
