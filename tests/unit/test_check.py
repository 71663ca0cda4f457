"""etweave.check and etweave.chakra.accepts on hand-built nodes: one rule at a time."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.accepts import (
    ATTR_TYPES,
    COMM_NODE_TYPES,
    SIMULATOR_ATTR_TYPES,
    SIMULATOR_MAPPING,
    SUPPORTED_COLLECTIVES,
    VALID_NODE_TYPES,
    comm_type_name,
    is_group_id,
)
from etweave.check import Violation, check_metadata, check_nodes, check_run, pg_init_problem

Attr = tuple[str, str, object]
GPU: tuple[Attr, ...] = (("is_cpu_op", "bool_val", False), ("device", "int64_val", 0), ("stream", "int64_val", 7))
ROOFLINE: tuple[Attr, ...] = (("num_ops", "int64_val", 0), ("tensor_size", "uint64_val", 0))


def nd(nid: int, ntype: int = pb.COMP_NODE, *attrs: Attr, data: Iterable[int] = (), ctrl: Iterable[int] = (),
       name: str = "") -> pb.Node:
    node = pb.Node(id=nid, name=name or f"n{nid}", type=ntype, data_deps=list(data),  # type: ignore[arg-type]
                   ctrl_deps=list(ctrl))
    for attr_name, kind, value in attrs:
        attr = node.attr.add(name=attr_name)
        if kind.endswith("_list"):
            getattr(attr, kind).values.extend(value)  # type: ignore[call-overload]
        else:
            setattr(attr, kind, value)
    return node


def comp(nid: int, *attrs: Attr, data: Iterable[int] = ()) -> pb.Node:
    return nd(nid, pb.COMP_NODE, *ROOFLINE, *attrs, data=data)


def coll(nid: int, comm_type: int, pg: str = "", size: int = 64) -> pb.Node:
    return nd(nid, pb.COMM_COLL_NODE, *GPU, ("comm_type", "int64_val", comm_type), ("comm_size", "int64_val", size),
              ("pg_name", "string_val", pg))


def p2p(nid: int, send: bool, src: int, dst: int, size: int = 64) -> pb.Node:
    return nd(nid, pb.COMM_SEND_NODE if send else pb.COMM_RECV_NODE, *GPU, ("comm_src", "int32_val", src),
              ("comm_dst", "int32_val", dst), ("comm_tag", "int32_val", 0), ("comm_size", "int64_val", size))


def rules(violations: list[Violation]) -> list[str]:
    return [v.rule for v in violations]


# --- what the simulator accepts ------------------------------------------------------------------------------


def test_the_mapping_lands_on_collectives_the_simulator_runs() -> None:
    assert set(SIMULATOR_MAPPING.values()) <= SUPPORTED_COLLECTIVES
    assert not set(SIMULATOR_MAPPING) & SUPPORTED_COLLECTIVES
    every = set(pb.CollectiveCommType.values())
    assert SUPPORTED_COLLECTIVES | set(SIMULATOR_MAPPING) == every  # each type is run or mapped
    assert COMM_NODE_TYPES < VALID_NODE_TYPES and pb.METADATA_NODE not in VALID_NODE_TYPES
    assert SIMULATOR_ATTR_TYPES.items() <= ATTR_TYPES.items()
    assert comm_type_name(pb.ALL_TO_ALL) == "ALL_TO_ALL" and comm_type_name(99) == "99"


@pytest.mark.parametrize(("name", "ok"), [("1", True), ("12", True), ("0", False), ("", False), ("a", False),
                                          ("-1", False), ("\u0663", False)])
def test_is_group_id(name: str, ok: bool) -> None:
    assert is_group_id(name) is ok


# --- per file and per rank -----------------------------------------------------------------------------------


def test_a_clean_rank_passes() -> None:
    nodes = [comp(1), comp(2, *GPU, ("kind", "string_val", "kernel"), data=[1]), coll(3, pb.ALL_REDUCE, "1"),
             p2p(4, True, 0, 1)]
    warnings: list[Violation] = []
    assert check_nodes(nodes, "f", warnings) == [] and warnings == []
    assert check_metadata(pb.GlobalMetadata(version="0.0.4"), "f") == []
    assert rules(check_metadata(pb.GlobalMetadata(), "f")) == ["metadata-empty"]


@pytest.mark.parametrize(("nodes", "expected"), [
    ([comp(1), comp(1)], ["duplicate-id"]),
    ([comp(1, data=[9])], ["dangling-data-dep"]),
    ([nd(1, pb.COMP_NODE, *ROOFLINE, ctrl=[9])], ["dangling-ctrl-dep"]),
    ([comp(1, data=[1])], ["self-edge"]),
    ([comp(1, data=[2]), comp(2, data=[1])], ["cycle"]),
    ([nd(1, pb.METADATA_NODE)], ["node-type"]),
    ([nd(1, pb.INVALID_NODE)], ["node-type"]),
    ([comp(1, ("comm_size", "int32_val", 1))], ["attr-type"]),
    ([nd(1, pb.COMP_NODE, ("num_ops", "int64_val", 0))], ["roofline-attr"]),
    ([comp(1, ("is_cpu_op", "bool_val", True), ("kind", "string_val", "kernel"))], ["is-cpu-op"]),
    ([nd(1, pb.COMM_COLL_NODE, *GPU, ("comm_type", "int64_val", pb.ALL_REDUCE))], ["comm-missing-attr"]),
    ([coll(1, pb.BARRIER)], ["unsupported-collective"]),
    ([coll(1, 42)], ["unsupported-collective"]),
    ([coll(1, pb.ALL_REDUCE, pg="x")], ["pg-id"]),
    ([nd(1, pb.COMP_NODE, *ROOFLINE, name="## process_group:init ##")], []),  # empty inputs.values: fine
])
def test_each_rule_catches_its_breakage(nodes: list[pb.Node], expected: list[str]) -> None:
    assert rules(check_nodes(nodes, "f")) == expected


def test_cycle_message_reads_in_execution_order() -> None:
    [v] = check_nodes([comp(3, data=[2]), comp(2, data=[4]), comp(4, data=[3]), comp(5, data=[3])], "f")
    assert v.message == "dependency cycle 2 -> 3 -> 4 -> 2; 4 nodes can never run" and v.node == 2


def test_warnings_are_not_violations() -> None:
    warnings: list[Violation] = []
    nodes = [coll(1, pb.ALL_GATHER, size=0), nd(2, pb.MEM_LOAD_NODE)]
    assert check_nodes(nodes, "f", warnings) == []
    assert rules(warnings) == ["comm-size-zero", "mem-node"]


def test_pg_init_problem() -> None:
    assert pg_init_problem("") is None
    assert pg_init_problem('["[{"pg_name": "0", "ranks": [0, 1]}]"]') is None  # cut 2 characters each side
    assert "shorter than" in (pg_init_problem("[]") or "")
    assert "decimal string pg_name" in (pg_init_problem('["[{"pg_name": 0, "ranks": []}]"]') or "")


# --- across ranks --------------------------------------------------------------------------------------------


def test_check_run_groups() -> None:
    ranks = {0: [coll(1, pb.ALL_REDUCE, "1")], 1: [coll(1, pb.ALL_REDUCE, "1")]}
    assert check_run(ranks, {"1": [0, 1]}) == []
    assert rules(check_run(ranks, None)) == ["pg-name", "pg-name"]
    assert rules(check_run(ranks, {"2": [0, 1]})) == ["pg-name", "pg-name"]
    [member] = check_run(ranks, {"1": [0]})
    assert (member.rule, member.where) == ("pg-member", "rank 1")
    assert rules(check_run(ranks, {"1": [0, 1], "0": [0]})) == ["pg-id"]  # ASTRA-sim asserts id > 0


def test_check_run_p2p_rank_and_notes() -> None:
    # the files are swapped: rank 0's holds the send from rank 1, rank 1's the recv to rank 0; they still match
    found = check_run({0: [p2p(1, True, 1, 0)], 1: [p2p(1, False, 1, 0)]}, {})
    assert [(v.rule, v.where) for v in found] == [("p2p-rank", "rank 0"), ("p2p-rank", "rank 1")]
    assert "send has comm_src 1, but its file is rank 0" in found[0].message
    notes: list[Violation] = []
    warnings: list[Violation] = []
    assert check_run({0: [p2p(1, True, 0, 3)]}, {}, notes, warnings) == []
    assert rules(notes) == ["p2p-unchecked"] and rules(warnings) == ["single-rank"]
