"""A structured mutation fuzzer over the real traces (issue 13): each case mutates one real input by one class of
mutation and runs an etweave command on it, in this process through `etweave.cli.main`, under a time limit.

Mutation classes: `type` (a field of another JSON type), `width` (numbers no output field holds), `encoding`
(invalid UTF-8, BOM, UTF-16, lone surrogates, NUL), `nesting` (deeply nested values), `delete`, `duplicate`,
`reorder` (records), `structure` (top level, truncation), `gzip` (members, truncation, corruption, bombs),
`special` (FIFO without writer, devices, folders, empty files), `et` (mutated .et files for check/simulate/jsonize),
`run` (mutated run folders for convert-run).

Outcomes: ok (0), bad_input (2), check (3): accepted answers; internal (1), hang, memory, bad_message (not one line
naming a file), files_left (an output or temporary file after a failure, or a temporary file after success):
failures. `python -m tests.fuzz --cases N [--seed S] [--as-limit-gib 4]` prints the table and a JSON summary.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
TRACES = Path(os.environ.get("ETWEAVE_TRACES", REPO.parent / "shared" / "traces"))

PAIRS = ["gpu/simple-add", "cpu-gloo/single_cnn/rank0", "cpu-gloo/dist_ddp_w2/rank0"]
KINETO_ONLY = ["kineto-only/event-sync-multistream.json.gz"]
RUN = "cpu-gloo/dist_ddp_w2"
CLASSES = ["type", "width", "encoding", "nesting", "delete", "duplicate", "reorder", "structure", "gzip", "special",
           "et", "run"]
ACCEPTED = ("ok", "bad_input", "check")
FAILURES = ("internal", "hang", "memory", "bad_message", "files_left")

# Markers replaced in the serialized bytes by what orjson cannot write (ints past 64 bits, deep nesting).
_MARK = "\u2603MARK{}\u2603"
_ODD_VALUES: list[Any] = [None, True, False, "x", "", 1.5, -1, 0, [], {}, [1, [2]], {"a": [1]}, "\u0000", 2**31]
_WIDE = [2**63, 2**64 - 1, -(2**63) - 1, 1e300, -1e300, float(2**62), -1, -(2**31) - 1, 2**31, 2**53 + 1,
         "1" + "0" * 40, "9" * 25, "1e400", "-1e400", "30000tid"]


class Hang(BaseException):  # not an Exception: etweave's catch-all for internal errors must not see it
    pass


@dataclass
class Case:
    cls: str
    seed: int
    command: list[str] = field(default_factory=list)
    note: str = ""


def _load(path: Path) -> Any:
    return orjson.loads(gzip.decompress(path.read_bytes()))


def _leaves(doc: Any, limit: int = 4000) -> list[tuple[Any, Any]]:
    """(container, key) of values in the document, breadth first, at most `limit`."""
    out: list[tuple[Any, Any]] = []
    level = [doc]
    while level and len(out) < limit:
        nxt = []
        for c in level:
            items = c.items() if isinstance(c, dict) else enumerate(c) if isinstance(c, list) else ()
            for k, v in items:
                out.append((c, k))
                if isinstance(v, dict | list):
                    nxt.append(v)
        level = nxt
    return out


def _records(doc: Any) -> list[Any]:
    """The lists of records a mutation deletes, duplicates or reorders: nodes, events, attrs, args."""
    found: list[Any] = []
    if isinstance(doc, dict):
        for key in ("nodes", "traceEvents"):
            if isinstance(doc.get(key), list):
                found.append(doc[key])
                for rec in doc[key][:400]:
                    if isinstance(rec, dict) and isinstance(rec.get("attrs"), list):
                        found.append(rec["attrs"])
    return found


def _serialize(doc: Any, marks: dict[str, bytes]) -> bytes:
    data = orjson.dumps(doc)
    for mark, raw in marks.items():
        data = data.replace(orjson.dumps(mark), raw)
    return data


def _mutate_json(rng: random.Random, cls: str, doc: Any) -> tuple[bytes, str]:
    marks: dict[str, bytes] = {}
    note = ""
    if cls in ("type", "width", "nesting"):
        for _ in range(rng.choice([1, 1, 1, 3])):
            leaves = _leaves(doc)
            if not leaves:
                break
            c, k = rng.choice(leaves)
            note = _mutate_leaf(rng, cls, c, k, marks)
    elif cls in ("delete", "duplicate", "reorder"):
        note = _mutate_records(rng, cls, doc) or note
    elif cls == "structure":
        doc, truncated = _mutate_structure(rng, doc)
        if truncated is not None:
            return truncated, "truncated"
    data = _serialize(doc, marks)
    if cls == "encoding":
        data, note = _mutate_encoding(rng, data)
    return data, note


def _mutate_leaf(rng: random.Random, cls: str, c: Any, k: Any, marks: dict[str, bytes]) -> str:
    """One leaf `c[k]` made odd (cls "type"), wide ("width") or deeply nested ("nesting"); what was done."""
    if cls == "type":
        c[k] = rng.choice(_ODD_VALUES)
        return f"{k}={c[k]!r}"[:40]
    if cls == "width":
        value = rng.choice(_WIDE)
        if value == "30000tid":
            c[k] = "t" * 30000
        elif isinstance(value, str) or not -(2**63) <= value <= 2**64 - 1:
            # what orjson cannot write (numbers past 64 bits, 1e400) goes in as raw text
            mark = _MARK.format(len(marks))
            marks[mark] = str(value).encode()
            c[k] = mark
        else:
            c[k] = value
        return f"{k}"
    depth = rng.choice([50, 256, 300, 1100, 20000])
    mark = _MARK.format(len(marks))
    marks[mark] = b"[" * depth + b"]" * depth
    c[k] = mark
    return f"depth {depth}"


def _mutate_records(rng: random.Random, cls: str, doc: Any) -> str:
    """Records of one list deleted, duplicated or reordered; what was done ("" when there is no list)."""
    lists = [lst for lst in _records(doc) if lst]
    if not lists:
        return ""
    lst = rng.choice(lists)
    n = rng.randint(1, max(1, len(lst) // rng.choice([2, 10, 50])))
    if cls == "delete":
        for _ in range(min(n, len(lst))):
            lst.pop(rng.randrange(len(lst)))
    elif cls == "duplicate":
        for _ in range(n):
            lst.insert(rng.randrange(len(lst) + 1), orjson.loads(orjson.dumps(rng.choice(lst))))
    elif rng.random() < 0.5:
        rng.shuffle(lst)
    else:
        i, j = rng.randrange(len(lst)), rng.randrange(len(lst))
        lst[i], lst[j] = lst[j], lst[i]
    return f"{n} records"


def _mutate_structure(rng: random.Random, doc: Any) -> tuple[Any, bytes | None]:
    """The document with a key dropped, wrapped, replaced or a top-level field made odd; or its JSON cut short
    (then the cut bytes are returned beside it)."""
    choice = rng.randrange(4)
    if choice == 0 and isinstance(doc, dict) and doc:
        doc.pop(rng.choice(list(doc)))
    elif choice == 1:
        doc = rng.choice([[doc], [], "x", 1, None])
    elif choice == 2:
        raw = orjson.dumps(doc)
        return doc, raw[: rng.randrange(len(raw))]
    elif isinstance(doc, dict):
        doc[rng.choice(["nodes", "traceEvents", "distributedInfo", "schema", "pid"])] = rng.choice(_ODD_VALUES)
    return doc, None


def _mutate_encoding(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    """The JSON bytes with an encoding fault: invalid UTF-8, a BOM, UTF-16, a lone surrogate or a NUL."""
    pos = rng.randrange(len(data))
    q = data.find(b'"', pos)
    q = q if q >= 0 else data.find(b'"')
    kind = rng.randrange(5)
    if kind == 0:
        return data[: q + 1] + b"\xff\xfe" + data[q + 1:], "invalid UTF-8"
    if kind == 1:
        return b"\xef\xbb\xbf" + data, "BOM"
    if kind == 2:
        return data.decode("utf-8").encode("utf-16"), "UTF-16"
    if kind == 3:
        return data[: q + 1] + b"\\ud800" + data[q + 1:], "lone surrogate"
    return data[: q + 1] + b"\x00" + data[q + 1:], "NUL"


def _gzip_variant(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    kind = rng.randrange(6)
    if kind == 0:
        cut = sorted(rng.sample(range(1, max(2, len(data))), k=min(2, max(1, len(data) - 1))))
        parts = [data[i:j] for i, j in zip([0, *cut], [*cut, len(data)], strict=True)]
        return b"".join(gzip.compress(p) for p in parts), "multi-member"
    packed = gzip.compress(data)
    if kind == 1:
        return packed[: rng.randrange(1, len(packed))], "truncated gzip"
    if kind == 2:
        buf = bytearray(packed)
        pos = rng.randrange(10, len(buf))
        buf[pos] ^= rng.randrange(1, 256)
        return bytes(buf), "corrupt byte"
    if kind == 3:
        return packed + gzip.compress(b" " * (64 << 20)), "bomb member"
    if kind == 4:
        return packed + b"\x00" * rng.randrange(1, 64), "trailing zeros"
    return packed + packed, "same member twice"


class Runner:
    """Runs cases in a scratch folder; the inputs are real traces, read once."""

    def __init__(self, workdir: Path, hang_seconds: float) -> None:
        self.workdir = workdir
        self.hang_seconds = hang_seconds
        self.docs: dict[str, Any] = {}
        self.et: bytes | None = None

    def doc(self, rel: str) -> Any:
        if rel not in self.docs:
            self.docs[rel] = orjson.dumps(_load(TRACES / rel))
        return orjson.loads(self.docs[rel])

    def reference_et(self) -> bytes:
        if self.et is None:
            d = self.workdir / "ref"
            d.mkdir(exist_ok=True)
            self._main(["convert", *self._pair(PAIRS[2]), "-o", str(d / "trace.0.et"), "--quiet"])
            self.et = (d / "trace.0.et").read_bytes()
        return self.et

    @staticmethod
    def _pair(rel: str) -> list[str]:
        return ["--host", str(TRACES / rel / "host.json.gz"), "--device", str(TRACES / rel / "kineto.json.gz")]

    def _main(self, argv: list[str]) -> tuple[int | str, str]:
        from etweave.cli import main

        err = io.StringIO()

        def alarm(signum: int, frame: Any) -> None:
            raise Hang()

        old = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, self.hang_seconds)
        try:
            # stdout with a binary buffer: jsonize writes bytes
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.TextIOWrapper(io.BytesIO())):
                code: int | str = main(argv)
        except Hang:
            code = "hang"
        except SystemExit as exc:  # argparse
            code = int(exc.code) if isinstance(exc.code, int) else 2
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        return code, err.getvalue()

    def case(self, cls: str, seed: int) -> tuple[str, Case, str]:
        rng = random.Random(seed)
        case = Case(cls, seed)
        box = Path(tempfile.mkdtemp(prefix=f"{cls}-", dir=self.workdir))
        inputs, out = box / "in", box / "out"
        inputs.mkdir()
        out.mkdir()
        try:
            argv, named, expected = self._build(rng, case, inputs, out)
            case.command = argv
            before = sorted(p.name for p in inputs.rglob("*"))
            code, err = self._main(argv)
            return self._judge(code, err, named, inputs, before, out, expected), case, err.strip()[:200]
        finally:
            shutil.rmtree(box, ignore_errors=True)

    def _build(self, rng: random.Random, case: Case, inputs: Path, out: Path) -> tuple[list[str], list[str], set[str]]:
        cls = case.cls
        if cls == "et":
            return self._build_et(rng, case, inputs)
        if cls == "run":
            return self._build_run(rng, case, inputs, out)
        if cls == "special":
            return self._build_special(rng, case, inputs, out)
        rel = rng.choice(PAIRS + KINETO_ONLY)
        if rel in KINETO_ONLY:
            side, doc = "--device", self.doc(rel)
        else:
            side = rng.choice(["--host", "--device"])
            doc = self.doc(f"{rel}/{'host' if side == '--host' else 'kineto'}.json.gz")
        data, case.note = _mutate_json(rng, cls if cls != "gzip" else "structure" if rng.random() < 0.2 else "none",
                                       doc)
        if cls == "gzip":
            data, case.note = _gzip_variant(rng, data)
        path = inputs / ("mutated.json.gz" if cls == "gzip" else "mutated.json")
        path.write_bytes(data)
        argv = ["convert", side, str(path)]
        if rel not in KINETO_ONLY and rng.random() < 0.8:  # with its real partner, mostly
            other = "--device" if side == "--host" else "--host"
            argv += [other, str(TRACES / rel / ("kineto.json.gz" if other == "--device" else "host.json.gz"))]
        argv += ["-o", str(out / "t.et"), "--report", str(out / "r.json")]
        return argv, [path.name], {"t.et", "r.json"}

    def _build_special(self, rng: random.Random, case: Case, inputs: Path, out: Path) \
            -> tuple[list[str], list[str], set[str]]:
        kind = rng.randrange(6)
        target = inputs / "special.json"
        if kind == 0:
            os.mkfifo(target)
            case.note = "FIFO without writer"
        elif kind == 1:
            target = Path(rng.choice(["/dev/zero", "/dev/urandom", "/dev/null"]))
            case.note = str(target)
        elif kind == 2:
            target.mkdir()
            case.note = "folder"
        elif kind == 3:
            target.write_bytes(b"")
            case.note = "empty"
        elif kind == 4:
            target.symlink_to(target)
            case.note = "symlink loop"
        else:
            target = inputs / "missing.json"
            case.note = "missing"
        if rng.random() < 0.7:
            argv = ["convert", rng.choice(["--host", "--device"]), str(target), "-o", str(out / "t.et")]
            expected = {"t.et"}
        else:
            argv = [rng.choice(["check", "simulate", "jsonize"]), str(target)]
            expected = set()
        return argv, [target.name], expected

    def _build_et(self, rng: random.Random, case: Case, inputs: Path) -> tuple[list[str], list[str], set[str]]:
        from etweave.chakra import et_def_pb2 as pb
        from etweave.chakra.io import parse, serialize

        data = self.reference_et()
        kind = rng.randrange(4)
        if kind == 0:
            buf = bytearray(data)
            for _ in range(rng.randint(1, 8)):
                buf[rng.randrange(len(buf))] = rng.randrange(256)
            data, case.note = bytes(buf), "bytes flipped"
        elif kind == 1:
            data, case.note = data[: rng.randrange(len(data))], "truncated"
        else:
            metadata, nodes = parse(data)
            node = rng.choice(nodes)
            choice = rng.randrange(6)
            if choice == 0:
                node.attr.append(pb.AttributeProto(name=rng.choice(["measured_duration_micros", "comm_src",
                                                                      "transfer_duration_micros"]),
                                                   double_val=rng.choice([float("nan"), float("inf"), -1e300])))
            elif choice == 1:
                node.duration_micros = rng.choice([2**64 - 1, 2**63, 2**62])
            elif choice == 2:
                node.data_deps.append(rng.choice([node.id, 2**64 - 1, nodes[-1].id + 1]))
            elif choice == 3:
                node.id = rng.choice([nodes[0].id, 2**64 - 1])
            elif choice == 4:
                node.start_time_micros = 2**64 - 1
            else:
                nodes.insert(rng.randrange(len(nodes)), rng.choice(nodes))
            data, case.note = serialize(metadata, nodes), f"field change {choice}"
        path = inputs / "trace.0.et"
        path.write_bytes(data)
        return [rng.choice(["check", "simulate", "jsonize"]), str(path)], [path.name], set()

    def _build_run(self, rng: random.Random, case: Case, inputs: Path, out: Path) \
            -> tuple[list[str], list[str], set[str]]:
        run = inputs / "run"
        shutil.copytree(TRACES / RUN, run)
        for p in run.rglob("*"):
            p.chmod(0o644 if p.is_file() else 0o755)
        kind = rng.randrange(6)
        ranks = sorted(run.iterdir())
        if kind == 0:
            ranks[0].rename(run / rng.choice(["rank9223372036854775808", "rank-1", "rank_1x", "RANK_07"]))
            case.note = "rank folder renamed"
        elif kind == 1:
            victim = rng.choice([p for p in run.rglob("*.json.gz")])
            victim.unlink()
            case.note = f"{victim.name} removed"
        elif kind == 2:
            shutil.copy(ranks[0] / "kineto.json.gz", ranks[0] / "kineto2.json.gz")
            case.note = "two Kineto traces"
        elif kind == 3:
            (ranks[0] / "kineto.json.gz").write_bytes((ranks[1] / "kineto.json.gz").read_bytes())
            case.note = "other rank's Kineto"
        elif kind == 4:
            doc = self.doc(f"{RUN}/rank1/kineto.json.gz")
            data, case.note = _mutate_json(rng, rng.choice(["type", "width", "delete"]), doc)
            (ranks[1] / "kineto.json.gz").write_bytes(gzip.compress(data))
        else:
            (run / "notes.json").write_bytes(b'{"hello": 1}')
            case.note = "unrelated JSON"
        argv = ["convert-run", str(run), "-o", str(out / "o"), "--jobs", "1", "--quiet"]
        return argv, ["run", "rank"], {"o"}

    def _judge(self, code: int | str, err: str, named: list[str], inputs: Path, before: list[str], out: Path,
               expected: set[str]) -> str:
        if code == "hang":
            return "hang"
        if code == 1:
            return "internal"
        if code == 2 and "out of memory" in err:
            return "memory"
        left = [p for p in out.rglob("*")]
        after = sorted(p.name for p in inputs.rglob("*"))
        if after != before:
            return "files_left"
        if code != 0:
            return "files_left" if left else _judge_failure(code, err, named)
        if any(p.name.startswith(".") for p in left):
            return "files_left"
        return "ok"


def _judge_failure(code: int | str, err: str, named: list[str]) -> str:
    """A command that failed and left nothing: a check failure, or bad input said in one line naming the file."""
    if code == 3 and (not err or err.startswith("etweave: check failed: ")):
        return "check"  # a violation may list its cases (check and simulate on stdout, a deadlock's nodes)
    if err.count("\n") != 1 or "Traceback" in err:
        return "bad_message"
    if code == 2 and not err.startswith("etweave: error: "):
        return "bad_message"
    if not any(name in err for name in named):  # the message names the file (or the run folder)
        return "bad_message"
    return {0: "ok", 2: "bad_input", 3: "check"}.get(code, "internal") if isinstance(code, int) else "internal"


def fuzz(cases: int, seed: int = 0, workdir: Path | None = None, hang_seconds: float = 60.0,
         show: Callable[[str], None] | None = None) -> tuple[Counter[tuple[str, str]], list[tuple[str, Case, str]]]:
    """`cases` cases spread evenly over the mutation classes; the outcome counts and every failing case."""
    os.environ.setdefault("ETWEAVE_PIPE_WAIT", "0.5")
    own = workdir is None
    root = Path(tempfile.mkdtemp(prefix="etweave-fuzz-")) if own else Path(workdir)  # type: ignore[arg-type]
    runner = Runner(root, hang_seconds)
    counts: Counter[tuple[str, str]] = Counter()
    failures: list[tuple[str, Case, str]] = []
    try:
        for n in range(cases):
            cls = CLASSES[n % len(CLASSES)]
            outcome, case, err = runner.case(cls, seed * 1_000_003 + n)
            counts[(cls, outcome)] += 1
            if outcome in FAILURES:
                failures.append((outcome, case, err))
                if show is not None:
                    show(f"{outcome}: {cls} seed {case.seed} {case.note}: {err}")
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
    return counts, failures


def table(counts: Counter[tuple[str, str]]) -> str:
    outcomes = [*ACCEPTED, *FAILURES]
    lines = [f"{'class':<10}" + "".join(f"{o:>12}" for o in outcomes) + f"{'total':>8}"]
    for cls in CLASSES:
        row = [counts[(cls, o)] for o in outcomes]
        lines.append(f"{cls:<10}" + "".join(f"{v:>12}" for v in row) + f"{sum(row):>8}")
    totals = [sum(counts[(c, o)] for c in CLASSES) for o in outcomes]
    lines.append(f"{'total':<10}" + "".join(f"{v:>12}" for v in totals) + f"{sum(totals):>8}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hang-seconds", type=float, default=60.0)
    parser.add_argument("--as-limit-gib", type=float, default=4.0, help="address-space limit (0: none)")
    args = parser.parse_args()
    if args.as_limit_gib:
        import resource

        limit = int(args.as_limit_gib * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    started = time.monotonic()
    counts, failures = fuzz(args.cases, args.seed, hang_seconds=args.hang_seconds,
                            show=lambda line: print(line, file=sys.stderr))
    print(table(counts))
    print(f"{args.cases} cases in {time.monotonic() - started:.0f} s")
    print(orjson.dumps({"counts": {f"{c}/{o}": v for (c, o), v in sorted(counts.items())},
                        "failures": [[o, c.cls, c.seed, c.note, e] for o, c, e in failures]}).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
