"""Finding every rank's traces in a run folder (the rules are in etweave.run's docstring)."""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import msgspec

from etweave.errors import BadInput
from etweave.read import widths

HOST, KINETO = "host", "kineto"
_PEEK = 4096
_RANK_DIR = re.compile(r"^rank[_-]?(\d+)$", re.IGNORECASE)
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_RANK_SUFFIX = re.compile(r"_(\d+)\.json(?:\.gz)?$", re.IGNORECASE)
_KINETO_MARK = re.compile(rb'"(?:traceEvents|schemaVersion|deviceProperties|distributedInfo)"\s*:')
_HOST_MARK = re.compile(rb'"(?:schema|nodes)"\s*:')


class RankFiles(msgspec.Struct):
    rank: int | None  # None: a one-rank folder whose rank the Kineto trace tells
    host: Path | None = None
    kineto: Path | None = None


class Discovery(msgspec.Struct):
    ranks: list[RankFiles]
    ignored: list[str] = msgspec.field(default_factory=list)  # readable JSON files that are no trace


def sniff(path: Path) -> str | None:
    """HOST, KINETO, or None for readable JSON that is neither; BadInput when the file is empty or corrupt."""
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 16)
    except OSError as exc:
        raise BadInput(path, f"cannot read: {exc.strerror or exc}") from exc
    head = raw
    if raw[:2] == b"\x1f\x8b":
        try:
            head = zlib.decompressobj(wbits=31).decompress(raw, _PEEK)
        except zlib.error as exc:
            raise BadInput(path, f"corrupt gzip data: {exc}") from exc
    head = head[:_PEEK]
    if not head.strip():
        raise BadInput(path, "empty (or truncated before its first bytes): cannot tell which trace it is")
    if _KINETO_MARK.search(head) or head.lstrip()[:1] == b"[":
        return KINETO
    if _HOST_MARK.search(head):
        return HOST
    return None


def _is_json(path: Path) -> bool:
    name = path.name.lower()
    return path.is_file() and (name.endswith(".json") or name.endswith(".json.gz"))


def _rank_in_name(name: str) -> int | None:
    m = _RANK_IN_NAME.search(name) or _RANK_SUFFIX.search(name)
    return int(m.group(1)) if m else None


def discover(run_dir: Path) -> Discovery:
    """The ranks of a run folder and their trace files (rules in the module docstring)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise BadInput(run_dir, "not a folder")
    finder = _Finder(run_dir)
    entries = sorted(run_dir.iterdir())
    for entry in entries:  # 1. rank folders
        m = _RANK_DIR.match(entry.name)
        if entry.is_dir() and m:
            for path in sorted(entry.iterdir()):
                if _is_json(path):
                    finder.add(int(m.group(1)), path)
    unranked: list[Path] = []
    for entry in (e for e in entries if _is_json(e)):  # 2. flat files with a rank in their name
        rank = _rank_in_name(entry.name)
        if rank is None:
            unranked.append(entry)
        else:
            finder.add(rank, entry)
    if not finder.found:  # 3. a one-rank folder
        return Discovery([_single_rank(run_dir, unranked, finder.ignored)], finder.ignored)
    finder.ignored.extend(str(p) for p in unranked)
    return Discovery([finder.found[r] for r in sorted(finder.found)], finder.ignored)


class _Finder(msgspec.Struct):
    run_dir: Path
    found: dict[int, RankFiles] = msgspec.field(default_factory=dict)
    ignored: list[str] = msgspec.field(default_factory=list)

    def add(self, rank: int, path: Path) -> None:
        """`path` is a trace of `rank`: its host ET or its Kineto trace by its content; ignored when neither."""
        kind = sniff(path)
        if kind is None:
            self.ignored.append(str(path))
            return
        widths.rank(path, "the rank in the name", rank)
        rf = self.found.setdefault(rank, RankFiles(rank))
        other = getattr(rf, kind)
        if other is not None:
            what = "host execution traces" if kind == HOST else "Kineto traces"
            raise BadInput(self.run_dir, f"rank {rank} has two {what}: {other} and {path}")
        setattr(rf, kind, path)


def _single_rank(run_dir: Path, unranked: list[Path], ignored: list[str]) -> RankFiles:
    """At most one host ET and one Kineto trace among files without a rank in their name: one rank."""
    single = RankFiles(None)
    for path in unranked:
        kind = sniff(path)
        if kind is None:
            ignored.append(str(path))
        elif getattr(single, kind) is not None:
            raise BadInput(run_dir, f"no rank folders (rank<N>/) or files with a rank in their name, and "
                                    f"more than one {kind} trace ({getattr(single, kind).name}, {path.name}): "
                                    "cannot tell which belong together")
        else:
            setattr(single, kind, path)
    if single.host is None and single.kineto is None:
        raise BadInput(run_dir, "no ranks found: expected rank<N>/ folders with host and/or Kineto traces, or "
                                "files named like *rank<N>*.json[.gz] or *_<N>.json[.gz]")
    return single
