"""Small hand-built graphs for the unit tests of the evidence stages: items written inline, no trace files."""

from __future__ import annotations

from etweave.assemble import op_record
from etweave.model import Graph, Ids, Item, OpRecord
from etweave.read.host_et import IO, HostOp


def graph(*items: Item, threads: dict[int | str, list[int]] | None = None,
          streams: dict[tuple[int, int], list[int]] | None = None) -> Graph:
    """A graph of these items (ids as given); fresh ids from after the largest."""
    return Graph(items=list(items), by_id={it.id: it for it in items}, threads=threads or {}, streams=streams or {},
                 ids=Ids(max((it.id for it in items), default=0) + 1))


def host_op(op_id: int, name: str, seq_id: int = -1, reads: tuple[int, ...] = (),
            writes: tuple[int, ...] = (), et_tid: int = 0, fw_tid: int = 0) -> OpRecord:
    """A host op whose inputs are the tensors `reads` and outputs the tensors `writes` (tensor id = storage id), on
    host ET thread `et_tid`; a backward op names its forward op's thread in `fw_tid`."""

    def io(ids: tuple[int, ...]) -> IO:
        return IO(values=[[t, t, 0, 4, 4, "cpu"] for t in ids], shapes=[[4] for _ in ids],
                  types=["Tensor(float)" for _ in ids])

    return op_record(HostOp(id=op_id, name=name, parent=0, et_tid=et_tid, rf_id=0, seq_id=seq_id, fw_parent=0,
                            fw_tid=fw_tid,
                            scope=0, op_schema="", inputs=io(reads), outputs=io(writes)))
