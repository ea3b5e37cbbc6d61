"""The embedded wiring: engine, search driver and scorer in one process, runs recorded in memory
(or Redis), metrics through prometheus-client. Same parts as the Ray Serve app, no Ray."""

from __future__ import annotations

import logging
import queue
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from gambit.checks import at_least
from gambit.cpu_info import check_cpu_weights, check_kv_dtype
from gambit.drafter_map import parse_drafters
from gambit.engine.config import SpecConfig
from gambit.scoring.spec import load_scorer_spec, reads_confidence
from gambit.search.store import check_no_password
from gambit.serving.local_scorer import LocalScorer
from gambit.serving.metrics import Metrics, PrometheusBackend
from gambit.serving.prompt_format import problem_formatter
from gambit.serving.scorer_client import RemoteScorer
from gambit.serving.security import check_client_tls
from gambit.serving.solve_config import SolveConfig, check_problem, check_run_id
from gambit.serving.target_service import CancelFlagged, TargetService
from gambit.serving.tree_view import (
    RETENTION_S,
    StoreUnavailable,
    open_trace_store,
    open_tree_view,
    taken_message,
)

log = logging.getLogger(__name__)


@dataclass
class EmbeddedConfig:
    """The in-process wiring."""

    model: str = ""  # target model: a folder or a name such as smollm2 ("" = the shipped target)
    scorer: str = ""  # scorer spec (gambit.scoring.spec): "" / process | mlp | sequence | confidence | folder
    scorer_address: str = ""  # host:port of a ScorerService to call instead of an in-process scorer
    scorer_tls_ca: str = ""  # PEM CA of a TLS Scorer at scorer_address ("" = plaintext)
    scorer_tls_cert: str = ""  # PEM client certificate for a Scorer that asks for one (--tls-client-ca)
    scorer_tls_key: str = ""  # PEM private key of scorer_tls_cert
    scorer_tls_server_name: str = ""  # the host the Scorer's certificate names, if not scorer_address's
    tree: str = "memory"  # "memory" or a redis:// URL for the tree view
    prefix: str = "gambit:"  # Redis key prefix; trees go under <prefix>tree (what `inspect --prefix` takes)
    retention_s: float = RETENTION_S  # seconds a finished run's record and tree stay in Redis
    num_blocks: int = 0  # KV blocks (0 = from the memory budget)
    max_num_seqs: int = 256  # traces in one engine batch at most
    spec_max_batch: int = SpecConfig.max_batch  # spec traces draft in steps of <= this many (0: no cap)
    drafters: str = ""  # drafters for a real checkpoint: pr=FOLDER,eagle3.1=FOLDER ("" = the shipped ones)
    cpu_weights: str = "float32"  # the engine's CPU linear weights: "float32" | "bfloat16" (EngineConfig)
    kv_dtype: str = "auto"  # the engine's KV cache elements: "auto" (the model's) | "float32" | "bfloat16"
    batch_invariant: bool | None = None  # a trace's floats its own in any batch (unset: on where it holds)

    def __post_init__(self) -> None:
        at_least(0, num_blocks=self.num_blocks)
        at_least(1, retention_s=self.retention_s)
        at_least(1, max_num_seqs=self.max_num_seqs)
        check_no_password(self.tree, "tree")  # from GAMBIT_REDIS_PASSWORD: a URL shows in ps and messages
        SpecConfig(max_batch=self.spec_max_batch, drafters=parse_drafters(self.drafters))  # checks, now
        check_cpu_weights(self.cpu_weights)
        check_kv_dtype(self.kv_dtype)
        check_client_tls("scorer_tls_", self.scorer_tls_ca, self.scorer_tls_cert, self.scorer_tls_key,
                         self.scorer_tls_server_name)
        if self.scorer_tls_ca and not self.scorer_address:
            raise ValueError("scorer_tls_ca: set only with scorer_address (an in-process scorer has no "
                             "channel)")


def build_target(cfg: EmbeddedConfig, metrics: Metrics | None, replica: str = "local",
                 scorer_app: str = "", token: str = "", resolve=None) -> TargetService:
    """``resolve``: finds a Scorer replica's direct endpoint (``RemoteScorer``), None = always the
    address given. The engine and scorer are built on a thread that exits, so the only OpenMP pool
    left is the engine thread's (``gambit.engine.torch_threads``)."""
    from gambit.engine import Engine, EngineConfig
    from gambit.engine.torch_threads import on_fresh_thread
    from gambit.paths import TARGET

    def build():
        model = cfg.model or str(TARGET)
        spec = SpecConfig(max_batch=cfg.spec_max_batch, drafters=parse_drafters(cfg.drafters))
        ecfg = EngineConfig(model=model, num_blocks=cfg.num_blocks or None, max_num_seqs=cfg.max_num_seqs,
                            preemption="evict", spec=spec,
                            cpu_weights=cfg.cpu_weights, kv_dtype=cfg.kv_dtype,
                            batch_invariant=cfg.batch_invariant)
        engine = Engine.from_pretrained(model, ecfg)
        hidden = engine.model.config.hidden_size
        if cfg.scorer_address:
            scorer = RemoteScorer(cfg.scorer_address, hidden, token=token, application=scorer_app,
                                  metrics=metrics, resolve=resolve, confidence=reads_confidence(cfg.scorer),
                                  tls_ca=cfg.scorer_tls_ca, tls_cert=cfg.scorer_tls_cert,
                                  tls_key=cfg.scorer_tls_key, tls_server_name=cfg.scorer_tls_server_name)
        else:
            scorer = LocalScorer(load_scorer_spec(cfg.scorer, hidden, note=log.warning), metrics)
        return engine, scorer

    engine, scorer = on_fresh_thread(build)
    return TargetService(engine, scorer, open_tree_view(cfg.tree, cfg.prefix, retention_s=cfg.retention_s),
                         metrics, replica, async_records=cfg.tree != "memory",
                         store=open_trace_store(cfg.tree, cfg.prefix, retention_s=cfg.retention_s),
                         format_problem=problem_formatter(cfg.model or str(TARGET)))


class Embedded:
    def __init__(self, cfg: EmbeddedConfig | None = None, token: str = "") -> None:
        """``token``: the bearer token a Scorer at ``cfg.scorer_address`` asks for ("" = none)."""
        self.cfg = cfg or EmbeddedConfig()
        self.prom = PrometheusBackend()
        self.metrics = Metrics(self.prom)
        self.target = build_target(self.cfg, self.metrics, token=token)

    def solve(self, problem: str, cfg: SolveConfig | None = None, run_id: str = "") -> Iterator[dict]:
        """Events as dicts: started, progress per round, result (the same records the API streams). A run
        whose cancel flag was set before admission (CancelRun on a client's own id) is one cancelled
        result, recorded, as the served Target answers it (no ``CancelFlagged`` raised at the caller)."""
        check_problem(problem)
        cfg = cfg or SolveConfig()
        if not isinstance(cfg, SolveConfig):  # a dict raised AttributeError at admission, fields unchecked
            raise ValueError(f"cfg: must be a SolveConfig (SolveConfig(**fields) checks them), "
                             f"got {type(cfg).__name__}")
        own = bool(run_id)
        if own:  # a client's own id: refused where a run holds it (its record stays GetRun's)
            old = self.target.tree.claim_run(check_run_id(run_id), status="queued")
            if old is not None:
                raise ValueError(taken_message(run_id, old))
        run_id = run_id or uuid.uuid4().hex[:16]
        q: queue.Queue = queue.Queue()
        try:
            self.target.start_run(run_id, problem, cfg, q.put)
        except CancelFlagged as e:  # never stepped: it ends cancelled, its record says so (GetRun)
            yield self._cancelled_unstarted(run_id, str(e))
            return
        except Exception:
            if own:  # refused before it started (its KV, its text): the id is free for a retry
                self.target.tree.delete_run(run_id)
            raise
        try:
            yield {"kind": "started", "run_id": run_id, "replica": self.target.replica}
            while True:
                d = q.get()
                yield d
                if d["kind"] == "result":
                    return
        finally:
            self.target.cancel(run_id, "cancelled", "consumer went away")

    def _cancelled_unstarted(self, run_id: str, reason: str) -> dict:
        """The result of a run cancelled before admission, written to its record (it said queued)."""
        from gambit.deployments.run_records import UNSTARTED, ended_result

        d = ended_result(run_id, "cancelled", reason + UNSTARTED)
        try:
            self.target.tree.put_run(run_id, status="cancelled", message=d["message"], result=d)
        except StoreUnavailable:
            log.warning("run %s: its cancelled record was not written (tree store unreachable)", run_id)
        return d

    def close(self) -> None:
        self.target.close()
