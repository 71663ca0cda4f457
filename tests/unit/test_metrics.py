"""A replay beside the measured run (etweave.simulate.metrics) on a hand-built two-node rank."""

from __future__ import annotations

from etweave.simulate.engine import RankGraph, SimNode, replay
from etweave.simulate.metrics import format_deadlock, summarize


def test_summary_compares_simulated_and_measured_times() -> None:
    # measured: 100..103 and 110..114 (span 14); simulated back to back: 0..3 and 3..7
    nodes = [SimNode(1, "a", 4, (), 3, "s", measured_start=100, measured_duration=3),
             SimNode(2, "b", 4, (1,), 4, "s", measured_start=110, measured_duration=4)]
    s = summarize(replay([RankGraph(0, nodes, "r0.et")], {}))
    assert (s["origin_us"], s["measured_span_us"], s["simulated_makespan_us"]) == (100, 14, 7)
    assert s["makespan_error_pct"] == -50.0
    err = s["start_error"]  # |issue + origin - measured start|: 0 and 7
    assert (err["count"], err["p50_us"], err["p95_us"], err["max_us"]) == (2, 0, 7, 7)
    assert err["p95_pct_of_span"] == 50.0
    assert [c["id"] for c in s["critical_path"]["top"]] == [2, 1]  # by contribution: 4 then 3
    assert s["per_rank"][0]["measured_span_us"] == 14


def test_deadlock_text_names_the_root_cause() -> None:
    nodes = [SimNode(1, "recv", 6, (), 1, None, comm_src=1, comm_dst=0, comm_tag=0)]
    out = replay([RankGraph(0, nodes), RankGraph(1, [])], {})
    text = format_deadlock(out)
    assert text.splitlines()[0] == ("deadlock: 1 nodes can never start (showing 1, root causes first; "
                                    "shown on ranks [0])")
    assert "rank 1 never sends it (0 matching sends)" in text
