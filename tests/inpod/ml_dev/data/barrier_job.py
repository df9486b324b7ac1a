"""A pure-Python job for `ml-dev why` tests: every rank meets the others at a TCP barrier that rank 0 serves, round after
round, printing a line per round. `--stall RANK --round K`: that rank sleeps inside `stall_here` before round K (the
straggler to find); the others then wait in `barrier`. Rank and peers come from the rank contract (NODE_RANK, NNODES,
MASTER_ADDR) that `ml-dev run` gives every rank. Standard library only, Python 3.8+.
"""

import argparse
import os
import socket
import time

PORT_OFFSET = 7


def stall_here(seconds: float) -> None:
    time.sleep(seconds)


def work(seconds: float) -> None:
    time.sleep(seconds)


def barrier(rank: int, size: int, server: "socket.socket | None", master: str, port: int, round_no: int) -> None:
    """Everyone sends its round to rank 0; rank 0 answers all once it has heard from every rank."""
    if rank == 0:
        assert server is not None
        peers: list = []
        while len(peers) < size - 1:
            conn, _ = server.accept()
            conn.recv(64)
            peers.append(conn)
        for conn in peers:
            conn.sendall(b"go\n")
            conn.close()
        return
    while True:
        try:
            conn = socket.create_connection((master, port), timeout=5)
            break
        except OSError:
            time.sleep(0.1)
    conn.settimeout(None)
    conn.sendall(f"{rank} {round_no}\n".encode())
    conn.recv(64)
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=1000000)
    parser.add_argument("--stall", type=int, default=-1)
    parser.add_argument("--round", type=int, default=3)
    parser.add_argument("--stall-seconds", type=float, default=600)
    parser.add_argument("--work", type=float, default=0.2)
    args = parser.parse_args()
    rank, size = int(os.environ["NODE_RANK"]), int(os.environ["NNODES"])
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "29500")) + PORT_OFFSET
    server = None
    if rank == 0:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", port))
        server.listen(64)
    for k in range(args.rounds):
        if rank == args.stall and k == args.round:
            stall_here(args.stall_seconds)
        work(args.work)
        barrier(rank, size, server, master, port, k)
        print(f"round {k} rank {rank}", flush=True)


if __name__ == "__main__":
    main()
