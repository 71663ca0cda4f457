"""Event-driven replay of Chakra `.et` files, compared with the measured timeline (`etweave simulate`)."""

from etweave.simulate.engine import CollInstance, GraphError, RankGraph, Replay, SimNode, Stuck, replay

__all__ = ["CollInstance", "GraphError", "RankGraph", "Replay", "SimNode", "Stuck", "replay"]
