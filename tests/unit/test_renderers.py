"""etweave.renderers: each output format on a tiny hand-built replay; the registries by name."""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import GZIP_MAGIC, read_et
from etweave.errors import BadInput
from etweave.output import write_together
from etweave.renderers import (
    REPLAY_RENDERERS,
    SUMMARY_RENDERERS,
    CsvRenderer,
    EtFile,
    Rendered,
    replay_renderer,
    summary_renderer,
)
from etweave.simulate.engine import RankGraph, Replay, SimNode
from etweave.simulate.timeline import NodeDetail

CPU, GPU = "cpu:tid1", "gpu0:stream7"


def tiny_replay() -> Replay:
    """Rank 3: a host op (measured 1000..1010 us) launching a kernel (1012..1032); simulated 0..10 and 10..30."""
    nodes = [SimNode(1, "aten::mm", pb.COMP_NODE, (), 10, CPU, 1000, 10, kind="host_op"),
             SimNode(2, "gemm_kernel", pb.COMP_NODE, (1,), 20, GPU, 1012, 20, kind="kernel")]
    return Replay(ranks=[RankGraph(3, nodes)], issue=[[0, 10]], start=[[0, 10]], end=[[10, 30]], makespan=30,
                  critical_path=[(0, 0), (0, 1)], contribution=[10, 20], collectives=[])


@dataclass
class Source:
    """A ReplaySource whose details are hand-built; counts how often they are read."""

    replay: Replay = field(default_factory=tiny_replay)
    reads: int = 0

    @property
    def details(self) -> list[dict[int, NodeDetail]]:
        self.reads += 1
        return [{1: NodeDetail(kind="host_op"), 2: NodeDetail(kind="kernel", deps=(1,), evidence=("1 launch",))}]


def csv_lines(renderer_options: dict[str, str], source: Source) -> list[str]:
    chunks = replay_renderer("csv", **renderer_options).render(source, Path("t.csv"))
    return b"".join(chunks).decode().splitlines()


def test_registry_by_name() -> None:
    assert set(REPLAY_RENDERERS) == {"timeline", "plot", "breakdown", "csv"}
    assert set(SUMMARY_RENDERERS) == {"json", "text"}
    assert replay_renderer("csv", table="steps") == CsvRenderer("steps")
    with pytest.raises(ValueError, match="no renderer 'svg'"):
        replay_renderer("svg")
    with pytest.raises(ValueError, match="table must be one of"):
        replay_renderer("csv", table="edges")
    with pytest.raises(ValueError, match="no summary renderer"):
        summary_renderer("yaml")


def test_nodes_csv() -> None:
    lines = csv_lines({"table": "nodes"}, Source())
    assert lines[0].startswith("rank,id,name,type,kind,resource,part_of,measured_start_us")
    assert len(lines) == 3
    assert lines[1].startswith("3,1,aten::mm,COMP_NODE,host_op,cpu:tid1,")
    assert lines[2].startswith("3,2,gemm_kernel,COMP_NODE,kernel,gpu0:stream7,")


def test_critical_path_csv_reads_no_details() -> None:
    source = Source()
    lines = csv_lines({"table": "critical_path"}, source)
    assert lines == ["order,rank,id,name,resource,simulated_start_us,simulated_end_us,critical_path_us",
                     "0,3,1,aten::mm,cpu:tid1,0,10,10", "1,3,2,gemm_kernel,gpu0:stream7,10,30,20"]
    assert source.reads == 0


def test_steps_csv_without_profiler_steps_has_one_row_for_the_rank() -> None:
    lines = csv_lines({"table": "steps"}, Source())
    assert lines[0] == ("rank,step,id,measured_start_us,measured_duration_us,simulated_start_us,"
                        "simulated_duration_us,duration_error_pct")
    assert len(lines) == 2 and lines[1].startswith("3,(no ProfilerStep: whole rank),")


def test_timeline_json() -> None:
    data = replay_renderer("timeline").render(Source(), Path("t.json"))
    assert isinstance(data, bytes)
    doc = orjson.loads(data)
    assert doc["displayTimeUnit"] == "ms"
    slices = {(e["name"], e["pid"]) for e in doc["traceEvents"] if e.get("ph") == "X"}
    names = {name for name, _ in slices}
    assert {"aten::mm", "gemm_kernel"} <= names
    assert len({pid for name, pid in slices if name == "aten::mm"}) == 2  # measured and simulated


def test_plot_and_breakdown_png() -> None:
    pytest.importorskip("matplotlib")
    for name in ("plot", "breakdown"):
        data = replay_renderer(name).render(Source(), Path(f"{name}.png"))
        assert isinstance(data, bytes) and data.startswith(b"\x89PNG\r\n\x1a\n")


def test_plot_of_ranks_not_simulated_is_bad_input() -> None:
    pytest.importorskip("matplotlib")
    with pytest.raises(BadInput, match="none of ranks"):
        replay_renderer("plot", ranks=frozenset({5})).render(Source(), Path("p.png"))
    with pytest.raises(BadInput, match=r"b\.png: no rank and step to draw"):
        replay_renderer("breakdown", ranks=frozenset({5})).render(Source(), Path("b.png"))


def test_rendered_writes_the_renderers_bytes(tmp_path: Path) -> None:
    source = Source()
    renderer = replay_renderer("csv", table="critical_path")
    write_together([Rendered(tmp_path / "cp.csv", renderer, source)])
    assert (tmp_path / "cp.csv").read_bytes() == b"".join(renderer.render(source, tmp_path / "cp.csv"))


@pytest.mark.parametrize("name", ["t.et", "t.et.gz"])
def test_et_file_round_trips(tmp_path: Path, name: str) -> None:
    metadata = pb.GlobalMetadata(version="0.0.4")
    nodes = [pb.Node(id=1, name="a", type=pb.COMP_NODE), pb.Node(id=2, name="b", type=pb.COMP_NODE, data_deps=[1])]
    write_together([EtFile(tmp_path / name, metadata, nodes)])
    data = (tmp_path / name).read_bytes()
    assert data.startswith(GZIP_MAGIC) == name.endswith(".gz")
    if name.endswith(".gz"):
        assert gzip.decompress(data)[:1] != GZIP_MAGIC[:1]
    read_meta, read_nodes = read_et(tmp_path / name)
    assert read_meta.version == "0.0.4"
    assert [(n.id, n.name, list(n.data_deps)) for n in read_nodes] == [(1, "a", []), (2, "b", [1])]


def test_summary_renderers() -> None:
    summary = {"b": 1, "a": [1]}
    assert summary_renderer("json").render(summary) == b'{\n  "b": 1,\n  "a": [\n    1\n  ]\n}\n'  # order kept


def test_text_summary_names_the_files_written() -> None:
    from etweave.simulate.metrics import summarize
    from etweave.simulate.steps import step_times

    replay = tiny_replay()
    summary = summarize(replay)
    summary["step_times"] = step_times(replay)
    summary["warnings"] = []
    summary.update({"csv": "n.csv", "timeline": "t.json"})
    text = summary_renderer("text").render(summary).decode()
    assert text.endswith("\nwrote timeline t.json\nwrote csv n.csv\n")  # the order the text always used
    assert "what-if" not in text
