"""The warm ranks' process group of tests/podsim/test_warm_ranks.py and bench/bench_ranks.py: a program run in the pods."""

from __future__ import annotations

GROUP = r'''
"""The stop matrix's stand-in collective (tests/podsim/stopjob.py), tagged: rank 0 serves MASTER_ADDR:MASTER_PORT."""
import os, socket, threading

class Group:
    def __init__(self):
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.seq, self.buf = 0, b""
        if self.rank == 0:
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("", int(os.environ["MASTER_PORT"])))
            listener.listen(self.world)
            self.conns, self.sums, self.lock = [], {}, threading.Lock()
            threading.Thread(target=self.accept, args=(listener,), daemon=True).start()
        for _ in range(300):
            try:
                self.sock = socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), timeout=5)
                break
            except OSError:
                import time; time.sleep(0.1)
        self.sock.settimeout(None)

    def accept(self, listener):
        while True:
            conn = listener.accept()[0]
            self.conns.append(conn)
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn):
        buf = b""
        while True:
            data = conn.recv(4096)
            if not data:
                return
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                tag, value = line.split()
                with self.lock:
                    got = self.sums.setdefault(tag, [0, 0])
                    got[0] += int(value); got[1] += 1
                    if got[1] == self.world:
                        for c in self.conns:
                            c.sendall(tag + b" %d\n" % got[0])

    def all_reduce(self, value, tag=None):
        self.seq += 1
        tag = (tag or "c%d" % self.seq).encode()
        self.sock.sendall(tag + b" %d\n" % value)
        while True:
            while b"\n" not in self.buf:
                self.buf += self.sock.recv(4096)  # an interrupt lands here: what was read stays in self.buf
            line, self.buf = self.buf.split(b"\n", 1)
            got_tag, total = line.split()
            if got_tag == tag:
                return int(total)
'''
