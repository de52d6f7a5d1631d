"""One message's round trip between two processes: EdgePipe's data plane against raw ZeroMQ
with CURVE and against gloo (what torch.distributed.pipelining sends over).

    .venv/bin/python bench/pingpong.py [--size 16384] [--trips 3000] [--repeats 3]

Two processes (one torch thread each) pass a float32 tensor of ``--size`` bytes back and
forth ``--trips`` times: through ``agent.transport.DataPlane`` as a stage does (encode, send,
wait in ``receive``), through a bare pair of CURVE PUSH/PULL sockets read by the waiting
thread, and through ``torch.distributed`` send/recv over gloo. The three sides alternate,
``--repeats`` times each. Reported: the median and 90th percentile round trip of each run
(the first 10% of trips left out), and the spread of the medians over repeats. Prints a table
and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.testbed import free_port  # noqa: E402  (the path above makes it importable)

SIDES = ("dataplane", "zmq", "gloo")


def _dataplane(rank: int, trips: int, size: int, addresses: Any, peers: Any, out: Any) -> None:
    import torch

    from agent.transport import DataPlane
    from agent.wire import encode_message

    torch.set_num_threads(1)
    plane = DataPlane(bind="tcp://127.0.0.1:0", identity=f"p{rank}")
    addresses.put((rank, plane.address, plane.public_key))
    _, address, key = peers.get()
    peer = f"p{1 - rank}"
    plane.connect(peer, address, key)
    tensor = torch.zeros(size // 4)
    mine, theirs = ("activation", "gradient") if rank == 0 else ("gradient", "activation")
    times = []
    try:
        for m in range(trips):
            if rank == 1:
                plane.receive(1, theirs, m, timeout_s=60)
            begun = time.perf_counter()
            header, frames = encode_message(run=1, kind=mine, microbatch=m, version=0,
                                            tensor=tensor, sent_at=time.time())
            plane.send(peer, frames, header=header)
            if rank == 0:
                plane.receive(1, theirs, m, timeout_s=60)
                times.append(time.perf_counter() - begun)
        if rank == 0:
            out.put(times)
        else:
            plane.flush(timeout_s=10)
            time.sleep(0.2)  # the last message leaves before the socket closes
    finally:
        plane.close()


def _zmq(rank: int, trips: int, size: int, addresses: Any, peers: Any, out: Any) -> None:
    import zmq

    context = zmq.Context()
    public, secret = zmq.curve_keypair()
    inbox = context.socket(zmq.PULL)
    inbox.curve_secretkey, inbox.curve_publickey, inbox.curve_server = secret, public, True
    port = inbox.bind_to_random_port("tcp://127.0.0.1")
    addresses.put((rank, f"tcp://127.0.0.1:{port}", public))
    _, address, key = peers.get()
    outbox = context.socket(zmq.PUSH)
    outbox.curve_secretkey, outbox.curve_publickey, outbox.curve_serverkey = secret, public, key
    outbox.connect(address)
    frames = [b"{}" * 60, bytes(size)]
    times = []
    for _ in range(trips):
        begun = time.perf_counter()
        if rank == 1:
            inbox.recv_multipart(copy=False)
        outbox.send_multipart(frames)
        if rank == 0:
            inbox.recv_multipart(copy=False)
            times.append(time.perf_counter() - begun)
    if rank == 0:
        out.put(times)
    time.sleep(0.2)
    outbox.close(linger=1000)
    inbox.close(linger=0)
    context.term()


def _gloo(rank: int, trips: int, size: int, addresses: Any, peers: Any, out: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    port = peers.get()[1]  # the parent chose it
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    tensor, received = torch.zeros(size // 4), torch.empty(size // 4)
    times = []
    for _ in range(trips):
        begun = time.perf_counter()
        if rank == 1:
            dist.recv(received, 0)
        dist.send(tensor, 1 - rank)
        if rank == 0:
            dist.recv(received, 1)
            times.append(time.perf_counter() - begun)
    if rank == 0:
        out.put(times)
    dist.destroy_process_group()


def round_trips(side: str, *, trips: int, size: int) -> list[float]:
    """The round trips of one run of ``side``, in seconds."""
    target = {"dataplane": _dataplane, "zmq": _zmq, "gloo": _gloo}[side]
    context = mp.get_context("spawn")
    addresses, out = context.Queue(), context.Queue()
    peers = [context.Queue(), context.Queue()]
    processes = [context.Process(target=target, args=(r, trips, size, addresses, peers[r], out))
                 for r in (0, 1)]
    for process in processes:
        process.start()
    if side == "gloo":  # both ranks meet at a port the parent chose
        port = free_port()
        for queue in peers:
            queue.put((0, port, b""))
    else:
        first, second = addresses.get(timeout=60), addresses.get(timeout=60)
        by_rank = {first[0]: first, second[0]: second}
        peers[0].put(by_rank[1])
        peers[1].put(by_rank[0])
    times: list[float] = out.get(timeout=600)
    for process in processes:
        process.join(timeout=60)
        if process.exitcode != 0:
            raise SystemExit(f"{side}: a process ended with {process.exitcode}")
    return times


def figures(times: list[float]) -> dict[str, float]:
    kept = sorted(times[len(times) // 10:])
    return {"median_us": 1e6 * statistics.median(kept),
            "p90_us": 1e6 * kept[int(0.9 * (len(kept) - 1))]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=16384,
                        help="bytes of each message's tensor (default 16384, the MLP's)")
    parser.add_argument("--trips", type=int, default=3000, help="round trips per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side")
    args = parser.parse_args(argv)
    if args.size < 4 or args.trips < 10 or args.repeats < 1:
        raise SystemExit("--size must be at least 4, --trips at least 10, --repeats at "
                         "least 1")
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    for _ in range(args.repeats):
        for side in SIDES:
            runs[side].append(figures(round_trips(side, trips=args.trips, size=args.size)))
            print(f"  {side}: {runs[side][-1]['median_us']:.0f} us", file=sys.stderr)
    rows = {side: {"median_us": statistics.median(r["median_us"] for r in got),
                   "min_us": min(r["median_us"] for r in got),
                   "max_us": max(r["median_us"] for r in got),
                   "p90_us": statistics.median(r["p90_us"] for r in got)}
            for side, got in runs.items()}
    print(f"{'side':10} {'round trip us (median, min-max)':>32} {'p90 us':>7}")
    for side, row in rows.items():
        print(f"{side:10} {row['median_us']:>15.0f} ({row['min_us']:.0f}-{row['max_us']:.0f})"
              f"{'':>6} {row['p90_us']:>7.0f}")
    print(json.dumps({"bench": "pingpong", "size": args.size, "trips": args.trips,
                      "repeats": args.repeats, "sides": rows, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
