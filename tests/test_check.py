"""`etweave check` and `etweave.check`: a clean run passes, and each rule catches the breakage it names."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import orjson
import pytest
from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.accepts import SIMULATOR_MAPPING, SUPPORTED_COLLECTIVES
from etweave.chakra.io import write_et
from etweave.check import Violation, check_nodes, check_run, pg_init_problem
from etweave.cli import main

AttrSpec = tuple[str, str, object]  # (name, oneof field, value)


def make_node(nid: int, ntype: int = pb.COMP_NODE, *, data: Iterable[int] = (), ctrl: Iterable[int] = (),
              attrs: Iterable[AttrSpec] = (), roofline: bool = True) -> pb.Node:
    """A node; a COMP_NODE also gets num_ops and tensor_size (0) unless `attrs` has them or roofline=False."""
    node = pb.Node(id=nid, name=f"n{nid}", type=ntype, data_deps=list(data), ctrl_deps=list(ctrl))  # type: ignore[arg-type]
    attrs = list(attrs)
    if ntype == pb.COMP_NODE and roofline:
        named = {name for name, _, _ in attrs}
        attrs += [a for a in (("num_ops", "int64_val", 0), ("tensor_size", "uint64_val", 0)) if a[0] not in named]
    for name, kind, value in attrs:
        attr = node.attr.add(name=name)
        if not kind:  # an attr with no value at all
            continue
        if kind.endswith("_list"):
            getattr(attr, kind).values.extend(value)  # type: ignore[arg-type]
        else:
            setattr(attr, kind, value)
    return node


def coll(nid: int, comm_type: int = pb.ALL_REDUCE, *, size: int = 1024, pg: str = "", data: Iterable[int] = (),
         extra: Iterable[AttrSpec] = ()) -> pb.Node:
    return make_node(nid, pb.COMM_COLL_NODE, data=data, attrs=[
        ("is_cpu_op", "bool_val", False), ("comm_type", "int64_val", comm_type), ("comm_size", "int64_val", size),
        ("pg_name", "string_val", pg), ("device", "int64_val", 0), ("stream", "int64_val", 7), *extra])


def p2p(nid: int, send: bool, src: int, dst: int, *, tag: int = 0, size: int = 64,
        data: Iterable[int] = ()) -> pb.Node:
    return make_node(nid, pb.COMM_SEND_NODE if send else pb.COMM_RECV_NODE, data=data, attrs=[
        ("is_cpu_op", "bool_val", False), ("comm_src", "int32_val", src), ("comm_dst", "int32_val", dst),
        ("comm_tag", "int32_val", tag), ("comm_size", "int64_val", size)])


def clean_rank() -> list[pb.Node]:
    """One rank's worth of every node kind etweave writes, all valid."""
    return [
        make_node(1, attrs=[("kind", "string_val", "process_root")]),
        make_node(2, data=[1], attrs=[("kind", "string_val", "host_op"), ("is_cpu_op", "bool_val", True),
                                      ("tid", "int64_val", 11), ("rf_id", "int64_val", 5)]),
        make_node(3, data=[2], attrs=[("kind", "string_val", "kernel"), ("is_cpu_op", "bool_val", False),
                                      ("device", "int64_val", 0), ("stream", "int64_val", 7),
                                      ("tensor_size", "uint64_val", 4096)]),
        coll(4, data=[2, 3], extra=[("collective_name", "string_val", "allreduce"),
                                    ("involved_dim", "bool_list", [True, False])]),
        make_node(5, data=[4], ctrl=[2], attrs=[("is_cpu_op", "bool_val", True), ("tid", "int64_val", 11)]),
    ]


def write_rank(folder: Path, rank: int, nodes: Iterable[pb.Node], prefix: str = "trace") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{prefix}.{rank}.et"
    write_et(path, pb.GlobalMetadata(version="0.0.4"), nodes)
    return path


def run_check(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main(["check", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def lines_of(out: str, rule: str) -> list[str]:
    return [line for line in out.splitlines() if f": {rule}: " in line]


# --- clean input ---------------------------------------------------------------------------------------------


def test_clean_folder_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for rank in (0, 1):
        nodes = clean_rank()
        nodes[3] = coll(4, pg="1", data=[2, 3])
        # rank 0 sends to rank 1 after its collective; rank 1 receives it
        nodes.append(p2p(6, rank == 0, 0, 1, tag=3, size=128, data=[4]))
        write_rank(tmp_path, rank, nodes)
    (tmp_path / "comm_group.json").write_bytes(orjson.dumps({"1": [0, 1]}))
    code, out, err = run_check(capsys, tmp_path)
    assert code == 0, out
    assert out.strip().endswith("2 file(s), 12 node(s): clean")
    assert "warning" not in out
    assert err == ""


def test_clean_single_file_passes_with_a_single_rank_warning(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = write_rank(tmp_path, 0, clean_rank())
    code, out, _ = run_check(capsys, path)
    assert code == 0, out
    assert out.splitlines()[-1].endswith("clean; 1 warning(s)")
    assert "warnings: single-rank 1" in out and "refuses 1 NPU" in out


def test_check_nodes_on_memory_nodes() -> None:
    assert check_nodes(clean_rank(), "rank 0") == []
    broken = [*clean_rank(), make_node(6, data=[42])]
    [violation] = check_nodes(broken, "rank 0")
    assert (violation.rule, violation.where, violation.node) == ("dangling-data-dep", "rank 0", 6)
    with pytest.raises(AttributeError):  # frozen
        violation.rule = "other"  # type: ignore[misc]


# --- one broken single file per rule -------------------------------------------------------------------------


def _with(*extra: pb.Node) -> Callable[[], list[pb.Node]]:
    return lambda: [*clean_rank(), *extra]


def _pg_init(nid: int, values: str) -> pb.Node:
    node = make_node(nid, data=[1], attrs=[("kind", "string_val", "process_group_init")])
    node.name = "## process_group:init ##"
    node.inputs.values = values
    return node


def _duplicate_id() -> list[pb.Node]:
    return [*clean_rank(), make_node(3, data=[1])]


SINGLE_FILE_CASES: list[tuple[str, Callable[[], list[pb.Node]], str]] = [
    # (rule, nodes, text the message must contain)
    ("duplicate-id", _duplicate_id, "earlier node"),
    ("dangling-data-dep", _with(make_node(6, data=[1, 99])), "data_dep 99"),
    ("dangling-ctrl-dep", _with(make_node(6, ctrl=[77])), "ctrl_dep 77"),
    ("self-edge", _with(make_node(6, data=[6])), "itself"),
    ("cycle", _with(make_node(10, data=[1, 12]), make_node(11, data=[10]), make_node(12, ctrl=[11]),
                    make_node(13, data=[12])), "10 -> 11 -> 12 -> 10"),
    ("attr-type", _with(make_node(6, pb.COMM_COLL_NODE, attrs=[("comm_type", "int32_val", 0),
                                                               ("comm_size", "int64_val", 8)])),
     "comm_type is int32_val, must be int64_val"),
    ("attr-type", _with(make_node(6, attrs=[("tid", "int32_val", 3)])), "tid is int32_val"),
    ("attr-type", _with(make_node(6, attrs=[("pg_name", "int64_val", 3)])), "pg_name is int64_val"),
    ("attr-type", _with(make_node(6, attrs=[("tensor_size", "int64_val", 3)])), "must be uint64_val"),
    ("attr-type", _with(make_node(6, attrs=[("involved_dim", "bool_val", True)])), "must be bool_list"),
    ("attr-type", _with(make_node(6, attrs=[("is_cpu_op", "", None)])), "is_cpu_op is no value"),
    ("is-cpu-op", _with(coll(6, extra=[("is_cpu_op", "bool_val", True)])), "comm node"),
    ("is-cpu-op", _with(make_node(6, attrs=[("kind", "string_val", "kernel"), ("is_cpu_op", "bool_val", True)])),
     "GPU work (kernel)"),
    ("comm-missing-attr", _with(make_node(6, pb.COMM_COLL_NODE, attrs=[("comm_type", "int64_val", 0)])),
     "COMM_COLL_NODE lacks comm_size"),
    ("comm-missing-attr", _with(make_node(6, pb.COMM_SEND_NODE, attrs=[("comm_src", "int32_val", 0),
                                                                       ("comm_dst", "int32_val", 1)])),
     "COMM_SEND_NODE lacks comm_tag, comm_size"),
    ("unsupported-collective", _with(coll(6, 42)), "comm_type 42 is not a CollectiveCommType"),
    ("node-type", _with(make_node(6, pb.INVALID_NODE)), "INVALID_NODE"),
    ("node-type", _with(make_node(6, pb.METADATA_NODE, data=[1])), "METADATA_NODE: ASTRA-sim aborts"),
    ("roofline-attr", _with(make_node(6, data=[1], roofline=False)), "lacks num_ops, tensor_size"),
    ("roofline-attr", _with(make_node(6, data=[1], attrs=[("num_ops", "int64_val", 5)], roofline=False)),
     "lacks tensor_size"),
    ("pg-id", _with(coll(6, pg="0", data=[1])), "pg_name '0'"),
    ("pg-id", _with(coll(6, pg="-2", data=[1])), "pg_name '-2'"),
    ("pg-id", _with(coll(6, pg="tp", data=[1])), "pg_name 'tp'"),
    ("pg-init-values", _with(_pg_init(6, '["[{\\"pg_name\\": \\"0\\", \\"ranks\\": []}]"]')), "not JSON"),
    ("pg-init-values", _with(_pg_init(6, "[]")), "shorter than the 4 characters"),
    ("pg-init-values", _with(_pg_init(6, "['[{\"pg_name\": 1, \"ranks\": []}]']")), "decimal string pg_name"),
]


@pytest.mark.parametrize(("rule", "build", "text"), SINGLE_FILE_CASES,
                         ids=[f"{rule}-{i}" for i, (rule, _, _) in enumerate(SINGLE_FILE_CASES)])
def test_broken_file_is_caught(tmp_path: Path, capsys: pytest.CaptureFixture[str], rule: str,
                               build: Callable[[], list[pb.Node]], text: str) -> None:
    path = write_rank(tmp_path, 0, build())
    code, out, _ = run_check(capsys, path)
    assert code == 3, out
    found = lines_of(out, rule)
    assert found, out
    assert any(text in line for line in found), found
    assert f"({rule} " in out.splitlines()[-1]  # the summary counts it


@pytest.mark.parametrize(("unsupported", "mapped"), sorted(SIMULATOR_MAPPING.items()))
def test_unsupported_collective_names_type_and_mapping(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       unsupported: int, mapped: int) -> None:
    assert mapped in SUPPORTED_COLLECTIVES
    path = write_rank(tmp_path, 0, [*clean_rank(), coll(6, unsupported, data=[1])])
    code, out, _ = run_check(capsys, path)
    assert code == 3
    [line] = lines_of(out, "unsupported-collective")
    assert pb.CollectiveCommType.Name(unsupported) in line
    assert f"writes it as {pb.CollectiveCommType.Name(mapped)}" in line


def test_empty_metadata(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # write_et refuses this, so write the stream by hand: a 0-byte GlobalMetadata, then a node
    data = make_node(1).SerializeToString()
    path = tmp_path / "trace.0.et"
    path.write_bytes(_VarintBytes(0) + _VarintBytes(len(data)) + data)
    code, out, _ = run_check(capsys, path)
    assert code == 3
    [line] = lines_of(out, "metadata-empty")
    assert "no version and no attrs" in line


def test_cycle_reports_blocked_nodes_and_only_one_violation() -> None:
    nodes = [make_node(1), make_node(2, data=[1, 3]), make_node(3, data=[2]), make_node(4, data=[3])]
    [violation] = check_nodes(nodes, "r")
    assert violation.rule == "cycle"
    assert "3 nodes can never run" in violation.message  # 2 and 3 on the cycle, 4 behind it


def test_long_chain_is_iterative_and_its_cycle_is_found() -> None:
    n = 50_000  # deep enough to overflow any recursive walk
    chain = [make_node(1)] + [make_node(i, data=[i - 1]) for i in range(2, n + 1)]
    assert check_nodes(chain, "r") == []
    chain[0].data_deps.append(n)
    [violation] = check_nodes(chain, "r")
    assert violation.rule == "cycle"
    assert f"({n} nodes)" in violation.message


# --- across ranks ---------------------------------------------------------------------------------------------


def two_ranks(tmp_path: Path, rank0: list[pb.Node], rank1: list[pb.Node], groups: dict[str, list[int]] | None) -> Path:
    write_rank(tmp_path, 0, rank0)
    write_rank(tmp_path, 1, rank1)
    if groups is not None:
        (tmp_path / "comm_group.json").write_bytes(orjson.dumps(groups))
    return tmp_path


def test_pg_name_missing_from_comm_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = [*clean_rank(), coll(6, pg="5", data=[1])]
    folder = two_ranks(tmp_path, nodes, [*clean_rank(), coll(6, pg="5", data=[1])], {"1": [0, 1]})
    code, out, _ = run_check(capsys, folder)
    assert code == 3
    found = lines_of(out, "pg-name")
    assert len(found) == 2  # once per rank, not once per node
    assert "'5'" in found[0] and "trace.0.et" in found[0]


def test_pg_name_without_any_comm_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_rank(tmp_path, 0, [*clean_rank(), coll(6, pg="1", data=[1])])
    code, out, _ = run_check(capsys, path)
    assert code == 3
    assert any("no comm-group map" in line for line in lines_of(out, "pg-name"))
    # the same file passes once the map is given on the command line
    groups = tmp_path / "groups.json"
    groups.write_bytes(orjson.dumps({"1": [0]}))
    code, out, _ = run_check(capsys, path, "--comm-group", groups)
    assert code == 0, out


def test_comm_group_option_overrides_folder_map(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = [*clean_rank(), coll(6, pg="1", data=[1])]
    folder = two_ranks(tmp_path, nodes, [*clean_rank(), coll(6, pg="1", data=[1])], {"1": [0, 1]})
    assert run_check(capsys, folder)[0] == 0
    other = tmp_path / "other.json"
    other.write_bytes(orjson.dumps({"9": [0, 1]}))
    code, out, _ = run_check(capsys, folder, "--comm-group", other)
    assert code == 3
    assert lines_of(out, "pg-name")


def test_rank_not_member_of_its_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = two_ranks(tmp_path, [*clean_rank(), coll(6, pg="1", data=[1])], [*clean_rank(), coll(6, pg="1")],
                       {"1": [1]})
    code, out, _ = run_check(capsys, folder)
    assert code == 3
    [line] = lines_of(out, "pg-member")
    assert "trace.0.et" in line and "rank 0 is not among its ranks [1]" in line


def test_collective_count_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # rank 1 misses the all-gather rank 0 issues: rank 0 would wait for it forever
    folder = two_ranks(tmp_path, [*clean_rank(), coll(6, pb.ALL_GATHER, data=[1])], clean_rank(), None)
    code, out, _ = run_check(capsys, folder)
    assert code == 3
    [line] = lines_of(out, "coll-mismatch")
    assert "trace.1.et" in line and "1 ALL_GATHER" in line


def test_send_recv_size_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = two_ranks(tmp_path, [*clean_rank(), p2p(6, True, 0, 1, tag=2, size=64)],
                       [*clean_rank(), p2p(6, False, 0, 1, tag=2, size=32)], None)
    code, out, _ = run_check(capsys, folder)
    assert code == 3
    [line] = lines_of(out, "p2p-match")
    assert "64 bytes" in line and "32 bytes" in line


def test_send_recv_tag_mismatch_leaves_both_unmatched(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = two_ranks(tmp_path, [*clean_rank(), p2p(6, True, 0, 1, tag=2)],
                       [*clean_rank(), p2p(6, False, 0, 1, tag=3)], None)
    code, out, _ = run_check(capsys, folder)
    assert code == 3
    found = lines_of(out, "p2p-match")
    assert len(found) == 2
    assert any("no matching recv on rank 1" in line and "trace.0.et" in line for line in found)
    assert any("no matching send on rank 0" in line and "trace.1.et" in line for line in found)


def test_matching_is_in_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # two sends 64 then 32 against recvs 32 then 64: each pair mismatches though the multisets agree
    folder = two_ranks(tmp_path, [*clean_rank(), p2p(6, True, 0, 1, size=64), p2p(7, True, 0, 1, size=32)],
                       [*clean_rank(), p2p(6, False, 0, 1, size=32), p2p(7, False, 0, 1, size=64)], None)
    code, out, _ = run_check(capsys, folder)
    assert code == 3
    assert len(lines_of(out, "p2p-match")) == 2


def test_send_on_wrong_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = two_ranks(tmp_path, [*clean_rank(), p2p(6, True, 1, 0)], [*clean_rank(), p2p(6, False, 1, 0)], None)
    code, out, _ = run_check(capsys, folder)
    assert code == 3
    send_line, recv_line = lines_of(out, "p2p-rank")
    assert "comm_src 1" in send_line and "trace.0.et" in send_line
    assert "comm_dst 0" in recv_line and "trace.1.et" in recv_line
    assert not lines_of(out, "p2p-match")  # the pair itself agrees


def test_peer_outside_inputs_is_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = two_ranks(tmp_path, [*clean_rank(), p2p(6, True, 0, 5)], clean_rank(), None)
    code, out, _ = run_check(capsys, folder)
    assert code == 0, out
    assert any(line.startswith("note: ") and "rank 5 is not among the inputs" in line for line in out.splitlines())
    assert "1 note(s)" in out.splitlines()[-1]


def test_check_run_api_keeps_notes_apart() -> None:
    notes: list[Violation] = []
    ranks = {0: [p2p(1, True, 0, 3)], 1: []}
    assert check_run(ranks, None, notes) == []
    assert [n.rule for n in notes] == ["p2p-unchecked"]
    broken = {0: [p2p(1, True, 0, 1)], 1: []}
    [violation] = check_run(broken, None)
    assert (violation.rule, violation.where, violation.node) == ("p2p-match", "rank 0", 1)


# --- output ---------------------------------------------------------------------------------------------------


def test_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_rank(tmp_path, 0, [*clean_rank(), make_node(6, data=[99]), make_node(7, data=[7])])
    code, out, _ = run_check(capsys, path, "--json")
    assert code == 3
    report = orjson.loads(out)
    assert report["ok"] is False
    assert report["counts"] == {"dangling-data-dep": 1, "self-edge": 1}
    assert {(v["rule"], v["node"]) for v in report["violations"]} == {("dangling-data-dep", 6), ("self-edge", 7)}


def test_output_is_capped_per_rule_with_exact_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_rank(tmp_path, 0, [*clean_rank(), *(make_node(100 + i, data=[10_000 + i]) for i in range(60))])
    code, out, _ = run_check(capsys, path)
    assert code == 3
    assert len(lines_of(out, "dangling-data-dep")) == 50
    assert "... 10 more dangling-data-dep violation(s) not shown" in out
    assert "60 violation(s) (dangling-data-dep 60)" in out.splitlines()[-1]
    assert run_check(capsys, path, "--max-per-rule", "0")[1].count(": dangling-data-dep: ") == 60


# --- bad input: exit 2, one line on stderr --------------------------------------------------------------------


def _truncated(path: Path) -> None:
    write_et(path, pb.GlobalMetadata(version="0.0.4"), clean_rank())
    path.write_bytes(path.read_bytes()[:-5])


@pytest.mark.parametrize("spoil", [
    _truncated,
    lambda path: path.write_bytes(b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01garbage"),
    lambda path: path.write_bytes(b""),
], ids=["truncated", "garbage", "empty"])
def test_unreadable_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 spoil: Callable[[Path], None]) -> None:
    path = tmp_path / "trace.0.et"
    spoil(path)
    code, out, err = run_check(capsys, path)
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("etweave: error: ") and "trace.0.et" in err
    assert out == ""


def test_bad_inputs_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_check(capsys, tmp_path / "missing")[0] == 2
    assert run_check(capsys, tmp_path)[0] == 2  # a folder without .et files
    write_rank(tmp_path, 0, clean_rank())
    (tmp_path / "comm_group.json").write_bytes(b'{"0": "all"}')
    code, _, err = run_check(capsys, tmp_path)
    assert code == 2 and "comm_group.json" in err
    (tmp_path / "comm_group.json").unlink()  # read beside the files too (etweave.runfolder), as simulate does
    write_rank(tmp_path / "b", 0, clean_rank())
    code, _, err = run_check(capsys, tmp_path / "trace.0.et", tmp_path / "b" / "trace.0.et")
    assert code == 2 and "rank 0 again" in err


# --- FORMATS.md 3b: what ASTRA-sim does ------------------------------------------------------------------------


def test_pg_init_values_the_feeder_can_parse() -> None:
    # Chakra's converter writes str() of the host ET list: the feeder's substr(2, size-4) leaves the JSON
    chakra_style = str(['[{"pg_name": "0", "pg_desc": "default_pg", "ranks": []}, {"pg_name": "3", "ranks": [0, 1]}]'])
    assert pg_init_problem(chakra_style) is None
    assert pg_init_problem("") is None  # etweave's own output: nothing to parse
    assert pg_init_problem('["[{\\"pg_name\\": \\"0\\", \\"ranks\\": []}]"]') is not None  # JSON-escaped: not JSON
    assert pg_init_problem("['[{\"pg_name\": \"0\", \"ranks\": [\"a\"]}]']") is not None


def test_comm_group_id_0_is_a_violation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = two_ranks(tmp_path, [*clean_rank(), coll(6, pg="1", data=[1])], [*clean_rank(), coll(6, pg="1")],
                       {"0": [0, 1], "1": [0, 1]})
    code, out, _ = run_check(capsys, folder)
    assert code == 3
    [line] = lines_of(out, "pg-id")
    assert "group id '0'" in line and "asserts id > 0" in line


def test_warnings_do_not_fail_and_are_counted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    extra = [coll(6, pb.ALL_GATHER, size=0, data=[1]), coll(7, pb.ALL_REDUCE, size=0, data=[6]),
             coll(8, pb.BROADCAST, size=0, data=[7]),  # replayed from its duration: size 0 is no problem
             make_node(9, pb.MEM_LOAD_NODE, data=[8], attrs=[("tensor_size", "uint64_val", 64)])]
    folder = two_ranks(tmp_path, [*clean_rank(), *extra], [*clean_rank(), *extra], None)
    code, out, _ = run_check(capsys, folder, "--json")
    assert code == 0, out
    report = orjson.loads(out)
    assert report["ok"] is True and report["counts"] == {}
    assert report["warning_counts"] == {"comm-size-zero": 4, "mem-node": 2}
    assert {(w["rule"], w["node"]) for w in report["warnings"]} == {
        ("comm-size-zero", 6), ("comm-size-zero", 7), ("mem-node", 9)}
    code, out, _ = run_check(capsys, folder)
    assert "warnings: comm-size-zero 4" in out and "warnings: mem-node 2" in out
    assert out.splitlines()[-1].endswith("clean; 6 warning(s)")


def test_check_api_warnings_stay_apart() -> None:
    warnings: list[Violation] = []
    nodes = [*clean_rank(), coll(6, size=0, data=[1])]
    assert check_nodes(nodes, "rank 0", warnings) == []
    assert check_run({0: nodes}, None, None, warnings) == []
    assert [w.rule for w in warnings] == ["comm-size-zero", "single-rank"]
    assert check_nodes(nodes, "rank 0") == [] and check_run({0: nodes}, None) == []  # no list given: none kept


# --- files written the way Chakra's converter writes them -------------------------------------------------------


def chakra_converter_rank(rank: int) -> tuple[pb.GlobalMetadata, list[pb.Node]]:
    """What mlcommons/chakra src/converter/pytorch_converter.py writes: a GlobalMetadata with attrs (schema, pid
    as uint64, time, start_ts, finish_ts) and no version; its node attrs (rf_id, fw_parent, seq_id, scope, tid,
    fw_tid, op_schema, is_cpu_op), ctrl_deps to the parent, data_deps; COMP_NODE roots; pg_name only when set."""
    metadata = pb.GlobalMetadata(attr=[
        pb.AttributeProto(name="schema", string_val="1.1.1-chakra.0.0.4"),
        pb.AttributeProto(name="pid", uint64_val=4242),
        pb.AttributeProto(name="time", string_val="2026-12-01 13:00:00"),
        pb.AttributeProto(name="start_ts", uint64_val=100),
        pb.AttributeProto(name="finish_ts", uint64_val=900),
    ])

    def node(nid: int, name: str, ntype: int, parent: int | None, data: list[int], gpu: bool = False) -> pb.Node:
        n = pb.Node(id=nid, name=name, type=ntype, data_deps=data, duration_micros=10)  # type: ignore[arg-type]
        if parent is not None:
            n.ctrl_deps.append(parent)
        n.inputs.values, n.inputs.shapes, n.inputs.types = "[]", "[]", "[]"
        n.attr.extend([pb.AttributeProto(name="rf_id", int64_val=nid), pb.AttributeProto(name="fw_parent", int64_val=0),
                       pb.AttributeProto(name="seq_id", int64_val=-1), pb.AttributeProto(name="scope", int64_val=0),
                       pb.AttributeProto(name="tid", int64_val=1), pb.AttributeProto(name="fw_tid", int64_val=0),
                       pb.AttributeProto(name="op_schema", string_val=""),
                       pb.AttributeProto(name="is_cpu_op", bool_val=not gpu)])
        return n

    root = node(2, "[pytorch|profiler|execution_trace|thread]", pb.COMP_NODE, None, [])
    mm = node(5, "aten::mm", pb.COMP_NODE, 2, [2])
    kernel = node(6, "ampere_sgemm_128x64_nn", pb.COMP_NODE, 5, [5], gpu=True)
    ar = node(7, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", pb.COMM_COLL_NODE, 5, [6], gpu=True)
    ar.attr.extend([pb.AttributeProto(name="comm_type", int64_val=pb.ALL_REDUCE),
                    pb.AttributeProto(name="comm_size", int64_val=4096)])
    return metadata, [root, mm, kernel, ar]


def chakra_write(path: Path, metadata: pb.GlobalMetadata, nodes: Iterable[pb.Node]) -> None:
    """Chakra's protolib.encodeMessage: each message preceded by its length as a varint (write_et insists on a
    version, which Chakra does not set)."""
    path.write_bytes(b"".join(_VarintBytes(m.ByteSize()) + m.SerializeToString() for m in (metadata, *nodes)))


def test_chakra_converter_files_are_read_and_judged_right(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for rank in (0, 1):
        metadata, nodes = chakra_converter_rank(rank)
        assert not metadata.version and metadata.ByteSize() > 0
        chakra_write(tmp_path / f"chakra.{rank}.et", metadata, nodes)
    code, out, _ = run_check(capsys, tmp_path, "--json")
    report = orjson.loads(out)
    assert report["nodes"] == 8, "every node read: the metadata with attrs is not mistaken for end of file"
    assert "metadata-empty" not in report["counts"]
    # Chakra writes no num_ops/tensor_size: ASTRA-sim's roofline mode would throw on its COMP_NODEs, and
    # nothing else in these files breaks a 3b rule
    assert report["counts"] == {"roofline-attr": 6}
    assert code == 3
    # with the two attrs added, the same files pass
    for rank in (0, 1):
        metadata, nodes = chakra_converter_rank(rank)
        for n in nodes:
            if n.type == pb.COMP_NODE:
                n.attr.extend([pb.AttributeProto(name="num_ops", int64_val=0),
                               pb.AttributeProto(name="tensor_size", uint64_val=0)])
        chakra_write(tmp_path / f"chakra.{rank}.et", metadata, nodes)
    code, out, _ = run_check(capsys, tmp_path)
    assert code == 0, out
    assert out.splitlines()[-1].endswith("2 file(s), 8 node(s): clean")


def test_chakra_metadata_node_for_process_group_init_is_caught(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    # Chakra writes `## process_group:init ##` as METADATA_NODE: ASTRA-sim aborts on it (3b.1)
    metadata, nodes = chakra_converter_rank(0)
    pg = pb.Node(id=3, name="## process_group:init ##", type=pb.METADATA_NODE, ctrl_deps=[2])
    pg.inputs.values = str(['[{"pg_name": "0", "ranks": []}]'])
    chakra_write(tmp_path / "chakra.0.et", metadata, [*nodes[:1], pg, *nodes[1:]])
    code, out, _ = run_check(capsys, tmp_path / "chakra.0.et")
    assert code == 3
    [line] = lines_of(out, "node-type")
    assert "node 3" in line and "METADATA_NODE" in line
    assert not lines_of(out, "pg-init-values"), "its values survive the feeder's parse"
