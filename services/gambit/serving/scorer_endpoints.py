"""Where a Target's ScorerService calls go: the proxy's ``address`` for the client's life, and a Scorer
replica's own (direct) endpoint while one is known and answers (``deployments/scorer.py``).

``ScorerEndpoints`` keeps one channel per address (channel set-up costs a handshake) and looks the direct
endpoint up in the background (a Ray handle call must not stall scoring). ``RemoteScorer`` is one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import grpc

from gambit.serving.limits import SCORER_ENDPOINT_MESSAGE_BYTES
from gambit.serving.protos import load
from gambit.serving.security import open_channel

log = logging.getLogger(__name__)

# channels kept to direct endpoints, besides ``address``'s (the least recently used closed beyond it): each
# Scorer replica restart gives a new address, and a Target kept a channel to every one it ever used
MAX_DIRECT_CHANNELS = 4


class ScorerEndpoints:
    def __init__(self, address: str, tls_ca: str = "", tls_cert: str = "", tls_key: str = "",
                 tls_server_name: str = "", resolve: Callable[[], str] | None = None,
                 refresh_s: float = 60.0, retry_after_s: float = 1.0) -> None:
        """``resolve``: returns a replica's direct ScorerService address ("" for none); it is called off
        the scoring path, at start, every ``refresh_s`` (``retry_after_s`` after it failed) and after the
        direct endpoint fails. ``tls_*``: a TLS Scorer's CA, this client's certificate and key (mTLS) and
        the name its certificate holds (``open_channel``)."""
        self.pb2, self._grpc = load("scorer")
        self.address, self.tls_ca = address, tls_ca
        self.tls_cert, self.tls_key, self.tls_server_name = tls_cert, tls_key, tls_server_name
        self._channels: OrderedDict[str, tuple[grpc.Channel, object]] = OrderedDict()  # LRU order
        self._channels_lock = threading.Lock()
        self.channel, self.stub = self._stub(address)
        self.resolve, self.refresh_s, self.retry_after_s = resolve, refresh_s, retry_after_s
        self.direct = ""  # the direct endpoint in use ("" = the proxy)
        self._resolving = False
        self._resolve_at = 0.0
        self._failures_seen = 0  # direct endpoint failures so far: a look-up begun before the last is stale
        self.resolve_error = ""
        self.direct_calls = 0

    def _stub(self, address: str):
        """One channel per address, reused: ``address``'s for the client's life, and the
        ``MAX_DIRECT_CHANNELS`` most recently used direct endpoints' (an older one, most likely a replica
        gone since, is closed; a call still on it fails and takes the proxy)."""
        with self._channels_lock:
            if address in self._channels:
                self._channels.move_to_end(address)
                return self._channels[address]
            ch = open_channel(address, self.tls_ca, self.tls_cert, self.tls_key,
                              options=[("grpc.max_send_message_length", SCORER_ENDPOINT_MESSAGE_BYTES)],
                              server_name=self.tls_server_name)
            self._channels[address] = got = (ch, self._grpc.ScorerServiceStub(ch))
            direct = [a for a in self._channels if a != self.address]
            for old in direct[:max(0, len(direct) - MAX_DIRECT_CHANNELS)]:
                self._channels.pop(old)[0].close()
            return got

    def _direct_gone(self, address: str) -> None:
        """The direct endpoint ``address`` did not answer (its replica went away): calls take the proxy,
        which routes to a live one, and the next call looks the endpoint up again. Its channel is closed:
        a replica restarted on the same port is reached by a fresh one at once, where the old one waited
        out its reconnect back-off (1 s and more), every call meanwhile failing on it. A look-up under way
        began before this failure and may return this very address: it is not used (``_resolve_now``)."""
        with self._channels_lock:
            self._failures_seen += 1
            if self.direct == address:
                self.direct = ""
            self._resolve_at = 0.0
            gone = self._channels.pop(address, None) if address != self.address else None
        if gone is not None:  # a call still on it fails (CANCELLED) and takes the proxy
            gone[0].close()

    def refresh(self) -> None:
        """Look the direct endpoint up now (in the background) unless one is known or being looked up."""
        if not self.direct:
            self._resolve_at = 0.0
            self._maybe_resolve()

    def _maybe_resolve(self) -> None:
        """Look the direct endpoint up in the background (a Ray handle call must not stall scoring)."""
        with self._channels_lock:  # one look-up at a time (``score`` and the sender thread both ask)
            if self.resolve is None or self._resolving or time.monotonic() < self._resolve_at:
                return
            self._resolving = True
            self._resolve_at = float("inf")  # set again once the look-up ends
            seen = self._failures_seen
        threading.Thread(target=self._resolve_now, args=(seen,), name="scorer-resolve", daemon=True).start()

    def _resolve_now(self, seen: int) -> None:
        """``seen``: the direct failures when the look-up began. One failed since (a replica went away
        while it ran) may have got the dead replica's address: it was tried first again, and failed, on
        each call until a later look-up; now it is dropped and the next call looks up again."""
        found, wait, error = "", self.refresh_s, ""
        try:
            found = self.resolve() or ""
        except Exception as e:  # noqa: BLE001 — no direct endpoint: keep using the proxy
            log.info("no direct scorer endpoint: %s", e)
            wait, error = self.retry_after_s, f"{type(e).__name__}: {e}"
        finally:
            with self._channels_lock:
                if self._failures_seen != seen:  # stale: from before the failure
                    found, wait = "", 0.0
                self.direct, self.resolve_error = found, error
                self._resolve_at = time.monotonic() + wait
                self._resolving = False

    def close_channels(self) -> None:
        with self._channels_lock:
            for ch, _ in self._channels.values():
                ch.close()
            self._channels.clear()
