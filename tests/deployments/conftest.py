"""One local Ray Serve for the whole session (Ray starts slowly on 2 shared cores).

Ray is started by ``gambit.deployments.local.start`` (single node, ``include_dashboard=False``)
and shut down from code at the end (never ``ray stop``). Redis is the real server, reached through
a TCP proxy the fault tests can cut; keys live under a random prefix and are deleted afterwards.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid

import pytest


class TCPProxy:
    def __init__(self, target: tuple[str, int], port: int = 0) -> None:
        self.target = target
        self.port = port
        self._lsock: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> TCPProxy:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self.port = s.getsockname()[1]
        self._lsock = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()
        return self

    def _accept(self, lsock: socket.socket) -> None:
        while True:
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(self.target, timeout=5)
            except OSError:
                c.close()
                continue
            # the 5 s are for connecting only: left on, the proxy cut every connection idle for 5 s
            # (redis-py reconnects and retries, so this only hid behind its retries)
            u.settimeout(None)
            with self._lock:
                self._conns += [c, u]
            running = [2]  # the pair's pipes still running: the last to end closes both sockets
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(a, b, running), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket, running: list[int]) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            with self._lock:  # no fd left open, none closed under a pipe still reading it
                running[0] -= 1
                if running[0] == 0:
                    for s in (a, b):
                        if s in self._conns:
                            self._conns.remove(s)
                        s.close()

    def stop(self) -> None:
        """Refuse new connections and cut the open ones."""
        if self._lsock is not None:
            try:
                self._lsock.shutdown(socket.SHUT_RDWR)  # wakes the accept() thread
            except OSError:
                pass
            self._lsock.close()
            self._lsock = None
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()


TOKEN = "test-token-" + uuid.uuid4().hex[:8]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def serve_stack():
    pytest.importorskip("ray.serve")
    import redis

    from gambit.deployments import local

    proxy = TCPProxy(("127.0.0.1", 6379)).start()
    prefix = f"test-serve-{uuid.uuid4().hex[:8]}:"
    os.environ["GAMBIT_TEST_SERVE_TOKEN"] = TOKEN
    cfg = local.ServeConfig(grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                            tree=f"redis://127.0.0.1:{proxy.port}/0", prefix=prefix,
                            token_env="GAMBIT_TEST_SERVE_TOKEN", scorer="", num_blocks=600,
                            coordinator_replicas=2, capacity=4, swap=1, round_interval=8, max_tokens=120,
                            spec_max_batch=0)  # runs of every decoding share batches: let them draft
    try:
        local.start(cfg, wait_s=400)
        yield {"cfg": cfg, "address": f"127.0.0.1:{cfg.grpc_port}", "proxy": proxy, "prefix": prefix,
               "redis": redis.Redis(decode_responses=True)}
    finally:
        local.stop()
        proxy.stop()
        r = redis.Redis()
        keys = list(r.scan_iter(f"{prefix}*"))
        if keys:
            r.delete(*keys)
