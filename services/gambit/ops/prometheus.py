"""A real Prometheus server on 127.0.0.1 for the live metrics check: scrape given targets every
second, answer instant queries. Uses the `prometheus` binary from `make ops-tools` (Debian package)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]


def find_tool(name: str) -> str:
    """$GAMBIT_TOOLS_BIN, then .tools/bin (make ops-tools), then PATH; FileNotFoundError otherwise."""
    for d in (os.environ.get("GAMBIT_TOOLS_BIN"), REPO / ".tools" / "bin"):
        if d and (Path(d) / name).is_file():
            return str(Path(d) / name)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found: run `make ops-tools` or set GAMBIT_TOOLS_BIN")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrometheusServer:
    """``with PrometheusServer(["127.0.0.1:8080"]) as prom: prom.query("up")``."""

    def __init__(self, targets: list[str], scrape_interval: str = "1s", start_timeout_s: float = 30.0):
        if not targets:
            raise ValueError("targets must name at least one host:port to scrape")
        self.targets, self.scrape_interval, self.start_timeout_s = targets, scrape_interval, start_timeout_s
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.tmp = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> PrometheusServer:
        self.tmp = tempfile.TemporaryDirectory(prefix="gambit-prom-")
        d = Path(self.tmp.name)
        every = self.scrape_interval
        cfg = {"global": {"scrape_interval": every, "evaluation_interval": every},
               "scrape_configs": [{"job_name": "gambit", "static_configs": [{"targets": self.targets}]}]}
        (d / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        self.log = open(d / "prometheus.log", "w")  # noqa: SIM115 — closed in __exit__
        self.proc = subprocess.Popen(
            [find_tool("prometheus"), f"--config.file={d / 'prometheus.yml'}",
             f"--storage.tsdb.path={d / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = (d / "prometheus.log").read_text()[-2000:]
                self.__exit__(None, None, None)
                raise RuntimeError(f"prometheus did not become ready: {log}")
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.tmp is not None:
            self.log.close()
            self.tmp.cleanup()
            self.tmp = None

    def query(self, expr: str) -> list[dict]:
        """Instant query now; the result vector (each {"metric": labels, "value": [t, "v"]})."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise ValueError(f"query {expr!r} failed: {body}")
        return body["data"]["result"]

    def wait_scraped(self, samples: int = 2, timeout_s: float = 60.0) -> None:
        """Until every target has been scraped `samples` times (rate() needs two); TimeoutError otherwise.
        Prometheus applies a new scrape config only after ~5 s, so the first scrape is never immediate."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.query(f"count_over_time(up[10m]) >= {samples}")
            if len(got) >= len(self.targets) and len(self.query("up == 1")) >= len(self.targets):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"targets not scraped {samples} times in {timeout_s:g} s: "
                                   f"{self.targets_up()}")
            time.sleep(0.5)

    def targets_up(self) -> dict[str, str]:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as r:
            body = json.load(r)
        return {t["scrapeUrl"]: t["health"] for t in body["data"]["activeTargets"]}


def empty_queries(prom: PrometheusServer, prefix: str, rate_interval: str = "1m") -> dict[str, list[str]]:
    """Every dashboard panel query and alert check that returns no series ("No data"), by panel/alert."""
    from gambit.ops.alerts import live_checks
    from gambit.ops.dashboards import panel_queries

    out: dict[str, list[str]] = {}
    for group in (panel_queries(prefix, rate_interval), live_checks(prefix)):
        for name, queries in group.items():
            missing = [q for q in queries if not prom.query(q)]
            if missing:
                out[name] = missing
    return out
