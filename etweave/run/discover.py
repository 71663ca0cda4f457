"""Finding every rank's traces in a run folder (the rules are in etweave.run's docstring)."""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from etweave.errors import BadInput
from etweave.read import widths

HOST, KINETO = "host", "kineto"
_PEEK = 4096
_RANK_DIR = re.compile(r"^rank[_-]?(\d+)$", re.IGNORECASE)
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_RANK_SUFFIX = re.compile(r"_(\d+)\.json(?:\.gz)?$", re.IGNORECASE)
_KINETO_MARK = re.compile(rb'"(?:traceEvents|schemaVersion|deviceProperties|distributedInfo)"\s*:')
_HOST_MARK = re.compile(rb'"(?:schema|nodes)"\s*:')


@dataclass(slots=True)
class RankFiles:
    rank: int | None  # None: a one-rank folder whose rank the Kineto trace tells
    host: Path | None = None
    kineto: Path | None = None


@dataclass(slots=True)
class Discovery:
    ranks: list[RankFiles]
    ignored: list[str] = field(default_factory=list)  # readable JSON files that are no trace


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
    found: dict[int, RankFiles] = {}
    ignored: list[str] = []

    def add(rank: int, path: Path) -> None:
        kind = sniff(path)
        if kind is None:
            ignored.append(str(path))
            return
        widths.rank(path, "the rank in the name", rank)
        rf = found.setdefault(rank, RankFiles(rank))
        other = getattr(rf, kind)
        if other is not None:
            what = "host execution traces" if kind == HOST else "Kineto traces"
            raise BadInput(run_dir, f"rank {rank} has two {what}: {other} and {path}")
        setattr(rf, kind, path)

    entries = sorted(run_dir.iterdir())
    for entry in entries:
        m = _RANK_DIR.match(entry.name)
        if entry.is_dir() and m:
            for path in sorted(entry.iterdir()):
                if _is_json(path):
                    add(int(m.group(1)), path)
    unranked: list[Path] = []
    for entry in entries:
        if not _is_json(entry):
            continue
        rank = _rank_in_name(entry.name)
        if rank is None:
            unranked.append(entry)
        else:
            add(rank, entry)
    if not found:
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
        return Discovery([single], ignored)
    ignored.extend(str(p) for p in unranked)
    return Discovery([found[r] for r in sorted(found)], ignored)
