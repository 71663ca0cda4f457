"""On every real pair, the nodes ASTRA-sim cannot issue are gone (FORMATS.md 3b.1, 3b.3): roots and
`## process_group:init ##` are zero-duration COMP_NODEs whose role is in `kind`, the process-group node's
inputs.values cannot be misread by the feeder, and every COMP_NODE carries num_ops and tensor_size."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from conftest import PAIRS, convert_pair

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import node_attrs
from etweave.check import check_nodes, pg_init_problem
from etweave.read.host_et import PG_INIT_NAME, read_host_et


@pytest.mark.parametrize("rel", PAIRS)
def test_no_node_type_astra_sim_cannot_issue(traces: Path, rel: str) -> None:
    result = convert_pair(traces, rel)
    host = read_host_et(traces / rel / "host.json.gz")
    by_id = {n.id: n for n in result.nodes}
    assert {n.type for n in result.nodes} <= {pb.COMP_NODE, pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE}
    roots = [op for op in host.ops if op.is_process_root or op.is_thread_root]
    assert roots, "every pair has a process or thread root"
    for op in roots:
        node = by_id[op.id]
        kind = "process_root" if op.is_process_root else "thread_root"
        assert (node.type, node.duration_micros, node_attrs(node)["kind"]) == (pb.COMP_NODE, 0, kind)
    for node in result.nodes:
        if node.type == pb.COMP_NODE:
            a = node_attrs(node)
            assert isinstance(a["num_ops"], int) and isinstance(a["tensor_size"], int), node.name
    assert check_nodes(result.nodes, rel) == []


@pytest.mark.parametrize("rel", [p for p in PAIRS if p.startswith("cpu-gloo/dist_")])
def test_process_group_init_node(traces: Path, rel: str) -> None:
    result = convert_pair(traces, rel)
    [op] = [op for op in read_host_et(traces / rel / "host.json.gz").ops if op.name == PG_INIT_NAME]
    node = next(n for n in result.nodes if n.id == op.id)
    a = node_attrs(node)
    assert (node.type, node.duration_micros, a["kind"]) == (pb.COMP_NODE, 0, "process_group_init")
    # empty: nothing for the feeder's substr(2, size-4) parse to misread; the groups stay readable in pg_config
    assert node.inputs.values == "" and pg_init_problem(node.inputs.values) is None
    groups = orjson.loads(orjson.loads(a["pg_config"])[0])
    assert groups == orjson.loads(op.inputs.values[0]) and groups[0]["pg_name"] == "0"
