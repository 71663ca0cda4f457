"""What a `.et` file and a run folder are: the one home of the rules `convert-run` writes by and `check`,
`simulate` and `jsonize` read by.

- A rank's file is `<prefix>.<rank>.et` (docs/FACTS.md §E1): ASTRA-sim opens `<prefix>.<npu id>.et` for each NPU and
  never reads a rank from the file's content, so the name decides. A file whose name carries no rank (`out.et`,
  what `etweave convert -o` may write) has the rank of its GlobalMetadata attr `rank`, else the default the
  caller gives (0 for a lone file). A metadata rank that is not an integer is bad input, whatever the name says.
- The process-group map is `comm_group.json` beside the `.et` files (the first file's folder that has one):
  `{"<decimal id>": [global ranks, ...]}` (docs/FACTS.md §E6). ASTRA-sim reads every key with `std::stoi`, so a
  key that is not ASCII decimal digits is bad input when the map is read; an id of 0 reads, and `check` reports
  it (`pg-id`: CommunicatorGroup asserts id > 0, 3b.5).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import msgspec

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import attr_value
from etweave.errors import BadInput
from etweave.read.source import read_plain

COMM_GROUP_FILE = "comm_group.json"
REPORT_FILE = "report.json"  # convert-run's audit, beside the .et files
_RANK_FILE = re.compile(r"^(.*)\.([0-9]+)\.et(?:\.gz)?$")  # a gzipped one is read too (ASTRA-sim reads no gzip)


def et_file_name(prefix: str, rank: int) -> str:
    """The file ASTRA-sim opens for `rank` given the workload prefix `prefix` (what convert-run writes)."""
    return f"{prefix}.{rank}.et"


def split_rank_name(path: Path | str) -> tuple[str, int] | None:
    """(prefix, rank) of a `<prefix>.<rank>.et[.gz]` file name, or None when the name carries no rank."""
    m = _RANK_FILE.match(Path(path).name)
    return (m[1], int(m[2])) if m else None


def rank_from_name(path: Path | str) -> int | None:
    named = split_rank_name(path)
    return named[1] if named is not None else None


def metadata_rank(metadata: pb.GlobalMetadata, path: Path | str) -> int | None:
    """GlobalMetadata attr `rank` (the last one when repeated), or None; bad input when it is not an integer."""
    rank: int | None = None
    for a in metadata.attr:
        if a.name == "rank":
            value = attr_value(a)
            if isinstance(value, bool) or not isinstance(value, int):
                raise BadInput(path, f"GlobalMetadata attr rank is {value!r}, not an integer")
            rank = value
    return rank


def file_rank(metadata: pb.GlobalMetadata, path: Path | str, default_rank: int | None = None) -> int:
    """The rank of a `.et` file: its name `<prefix>.<rank>.et`, else its GlobalMetadata attr `rank`, else
    `default_rank` (the module docstring says why the name comes first)."""
    in_metadata = metadata_rank(metadata, path)  # read first: a malformed attr is bad input even when named
    rank = rank_from_name(path)
    if rank is None:
        rank = in_metadata if in_metadata is not None else default_rank
    if rank is None:
        raise BadInput(path, "no rank: neither a name like <prefix>.<rank>.et nor a GlobalMetadata attr `rank`")
    return rank


def rank_disagreement(metadata: pb.GlobalMetadata, path: Path | str) -> str | None:
    """What to warn about when a file's name and its metadata name different ranks (the name wins)."""
    named, in_metadata = rank_from_name(path), metadata_rank(metadata, path)
    if named is None or in_metadata is None or named == in_metadata:
        return None
    return (f"its name says rank {named}, its metadata rank {in_metadata}: read as rank {named}, as ASTRA-sim "
            f"opens <prefix>.<rank>.et (rename the file if it is rank {in_metadata}'s)")


def lone_file_rank(files: Sequence[Path]) -> int | None:
    """The default rank of a file whose name and metadata carry none: 0 when it is the only file given."""
    return 0 if len(files) == 1 else None


def find_comm_group(traces: Sequence[Path]) -> Path | None:
    """`comm_group.json` beside the first trace that has one."""
    for trace in traces:
        candidate = Path(trace).parent / COMM_GROUP_FILE
        if candidate.is_file():
            return candidate
    return None


def comm_groups_for(traces: Sequence[Path], given: Path | None) -> tuple[Path | None, dict[str, list[int]] | None]:
    """The process-group map trace files are read with, and its file: the file given, else `comm_group.json`
    beside them; (None, None) when there is none."""
    path = Path(given) if given is not None else find_comm_group(traces)
    return path, (read_comm_groups(path).members if path is not None else None)


class CommGroups(msgspec.Struct, frozen=True):
    """The process-group map of a run: comm-group id -> its global ranks, ids in ascending order. Read from
    `comm_group.json` (`read_comm_groups`), or built by convert-run from the traces' process groups
    (`etweave.run.cross_rank.build_comm_group`), which also gives each trace group name its id and its notes."""

    members: dict[str, list[int]] = msgspec.field(default_factory=dict)  # "" (all ranks) is never a key
    ids: dict[str, str] = msgspec.field(default_factory=dict)  # trace pg name -> comm-group id ("" = all ranks)
    notes: tuple[str, ...] = ()  # what building the map noticed (descriptions that disagree)

    def to_json(self) -> dict[str, list[int]]:
        """What `comm_group.json` holds."""
        return dict(self.members)


def parse_comm_groups(data: object, path: Path | str) -> CommGroups:
    """The map a parsed `comm_group.json` holds, checked: an object of decimal ids to lists of integer ranks."""
    if not isinstance(data, dict):
        raise BadInput(path, 'expected an object {"<decimal group id>": [global ranks, ...]}')
    members: dict[str, list[int]] = {}
    for key, ranks in data.items():
        if not (key.isascii() and key.isdecimal()):
            raise BadInput(path, f"group id {key!r} is not a decimal number (ASTRA-sim reads ids as integers)")
        if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
            raise BadInput(path, f"group {key}: expected a list of integer ranks")
        members[key] = ranks
    return CommGroups(members)


def read_comm_groups(path: Path) -> CommGroups:
    """`comm_group.json` (or any file given as the map), read and checked."""
    try:
        data = json.loads(read_plain(Path(path)))
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the stdlib parser goes
        raise BadInput(path, f"not JSON: {exc}") from exc
    return parse_comm_groups(data, path)

