"""Train a small model on 2 CPU processes (gloo, DDP) and record a run folder with etweave.collect.

    python examples/train_gloo.py --out RUN_DIR [--steps 3]
    etweave convert-run RUN_DIR -o OUT_DIR

Each step runs DDP forward/backward/optimizer plus one explicit call of every collective gloo offers (all_reduce,
broadcast, all_gather, reduce_scatter, all_to_all, barrier, send/recv), each on a tensor of its own size so it can
be recognized in the converted trace (see NUMEL).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from etweave.collect import collect

WORLD = 2
# float32 elements of each explicit collective's tensor (per rank); all different so each call is recognizable.
NUMEL = {
    "all_reduce": 1024,
    "broadcast": 512,
    "all_gather": 256,  # per-rank input; the output holds WORLD * 256
    "reduce_scatter": 768,  # full input; each rank gets 768 / WORLD
    "all_to_all": 128,  # input = output, WORLD chunks of 64
    "send_recv": 64,
}
WAIT, WARMUP = 1, 1  # DDP rebuilds its buckets (with a broadcast) in step 2: keep that out of the recorded window


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))


def collectives(rank: int) -> None:
    """One call of each collective; p2p: rank 0 sends then receives, rank 1 the reverse (no deadlock)."""
    f = torch.float32
    dist.all_reduce(torch.ones(NUMEL["all_reduce"], dtype=f))
    dist.broadcast(torch.full((NUMEL["broadcast"],), float(rank), dtype=f), src=0)
    gathered = torch.empty(WORLD * NUMEL["all_gather"], dtype=f)
    dist.all_gather_single(gathered, torch.ones(NUMEL["all_gather"], dtype=f))
    scattered = torch.empty(NUMEL["reduce_scatter"] // WORLD, dtype=f)
    dist.reduce_scatter_single(scattered, torch.ones(NUMEL["reduce_scatter"], dtype=f))
    exchanged = torch.empty(NUMEL["all_to_all"], dtype=f)
    dist.all_to_all_single(exchanged, torch.arange(NUMEL["all_to_all"], dtype=f))
    dist.barrier()
    peer = 1 - rank
    msg = torch.full((NUMEL["send_recv"],), float(rank), dtype=f)
    if rank == 0:
        dist.send(msg, dst=peer)
        dist.recv(msg, src=peer)
    else:
        dist.recv(msg, src=peer)
        dist.send(msg, dst=peer)


def worker(rank: int, port: int, out: str, steps: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)  # 2 processes on 2 cores: intra-op threads would only contend
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(0)
        net = DistributedDataParallel(model())
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        x, y = torch.randn(16, 32), torch.randn(16, 8)
        with collect(out, steps=steps, wait=WAIT, warmup=WARMUP) as c:
            for _ in range(c.total_steps):
                opt.zero_grad()
                nn.functional.mse_loss(net(x), y).backward()  # DDP all_reduces the gradient bucket here
                opt.step()
                collectives(rank)
                c.step()
        dist.barrier()  # both ranks have written their files
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="run folder to write (rank<N>/host.json.gz, ...)")
    ap.add_argument("--steps", type=int, default=3, help="training steps to record (default 3)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    mp.spawn(worker, args=(free_port(), str(args.out), args.steps), nprocs=WORLD, join=True)
    print(f"wrote {args.out}/rank0..{WORLD - 1}/{{host,kineto}}.json.gz")
    return 0


if __name__ == "__main__":
    sys.exit(main())
