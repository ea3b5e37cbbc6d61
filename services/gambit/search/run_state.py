"""One search run over a shared engine: its nodes, the method's rules, its rounds.

The driver routes engine events here and calls ``do_round`` every Δ decode steps. Methods:
* gambit: tournament rounds (Case 1 / Case 2), evicted traces become ghosts;
* sc: C independent traces; an evicted trace is requeued (recompute, as vLLM preempts);
* step: scored traces, the lowest-ranked evicted under memory pressure, never replaced;
* deepconf: warm-up traces set a confidence threshold, later traces stop below it.

Mixed in, one concept each: the run's limits (``run_limits``), its vote and result (``run_vote``), its
writes to the tree store (``run_persist``).
"""

from __future__ import annotations

import time

from gambit.engine import SamplingParams
from gambit.engine.engine import derive_seed
from gambit.engine.sequence import Trace
from gambit.scoring.confidence import ConfidenceTracker
from gambit.search import tree as T
from gambit.search.config import MAX_TEMPERATURE, SearchConfig
from gambit.search.deepconf import ConfidenceWindow, threshold, token_confidence
from gambit.search.node_json import NodeJSON
from gambit.search.results import Progress, RunResult
from gambit.search.run_limits import RunLimits
from gambit.search.run_persist import SCORE_WRITE_EVERY, RunPersist
from gambit.search.run_vote import RunVote
from gambit.search.tournament import plan_round
from gambit.search.tree import Node, RoundRecord
from gambit.tasks.graded import answer_key

__all__ = ["SCORE_WRITE_EVERY", "TIMING_KEYS", "SearchRun"]

TIMING_KEYS = ("forward", "guidance", "tree", "scheduling")


class SearchRun(RunLimits, RunVote, RunPersist):
    def __init__(self, run_id: str, cfg: SearchConfig, prompt: str, prompt_ids: list[int],
                 gold: str | None, engine, scorer, owner: dict) -> None:
        if cfg.method in ("gambit", "step") and scorer is None:
            raise ValueError(f"method {cfg.method!r} needs a scorer")
        self.run_id, self.cfg, self.prompt, self.prompt_ids, self.gold = run_id, cfg, prompt, prompt_ids, gold
        # owner: engine id -> (run, node id, node), shared by the driver's runs
        self.engine, self.scorer, self.owner = engine, scorer, owner
        self.nodes: dict[int, Node] = {}
        self.step = self.round = self.tokens = 0
        # Δ's clock: decode steps as plain decoding counts them, i.e. tokens a trace emits. A plain step
        # advances it by 1 (so it is ``step``); a speculative step by the mean tokens its emitting traces
        # took (>= 1), so rounds fall every ~Δ tokens whether the run speculates or not
        self.clock, self.tick, self.next_round = 0.0, 1.0, cfg.interval
        self.pruned = self.branched = self.evicted = 0
        # the run's clock (max_wall_s, elapsed, wall_s): from its submit, so a run held for batch slots
        # counts its wait as a client's deadline does (``SearchDriver._admit``); a takeover moves it back
        self.t0 = time.perf_counter()
        self.started_at = time.time()  # its submit, stored: a takeover's clock goes on from it
        self.timings = dict.fromkeys(TIMING_KEYS, 0.0)
        self.windows: dict[int, ConfidenceWindow] = {}
        # the scorer also reads the target's sampled-token confidence: one tracker per node
        self.confidence = bool(getattr(scorer, "confidence", False)) and cfg.method in ("gambit", "step")
        self.conf: dict[int, ConfidenceTracker] = {}
        self.per_token = cfg.method == "deepconf"  # its windows read every token's top log-probs
        # node id -> its engine trace while resident: the node's tokens (and confidence inputs) are
        # read from it where the tree view needs them (``sync``), not appended per token event
        self.traces: dict[int, Trace] = {}
        self.synced_at = -1  # the engine's step count at the last ``sync_all``
        self.threshold: float | None = None
        self.limit_hit = ""  # which run limit ended it (over_limit)
        self.budget_cut = False  # a trace stopped at a cap ``fit_budget`` set (the run ends "limit")
        self.budget_caps: dict[int, int] = {}  # node id -> its trace's max_tokens before ``fit_budget``
        self.phase = 1
        self.target = cfg.capacity  # the pool's size: C, less the slots floor prunes gave up
        self.dirty: set[int] = set()  # nodes whose tree-view record changed since the last write
        self.scored: set[int] = set()  # nodes with new scores only (written every SCORE_WRITE_EVERY rounds)
        self.active: set[int] = set()  # the tree view's pool (running + ghosts), kept as it changes
        self.written: dict[int, int] = {}  # node id -> its depth in the store (tokens lag until it changes)
        self.meta_written = False  # the static part of meta (config, prompt) is written once
        self.json: dict[int, NodeJSON] = {}  # node id -> its cached JSON fragments (store writes)
        self.votes: dict[str, int] = {}  # answers of finished traces, kept as they finish
        self.finished = 0
        self.pending_rounds: list[dict] = []
        self.result: RunResult | None = None

    def round_this_step(self) -> bool:
        """Whether this step, once counted (``tick``), reaches the next round."""
        return self.clock + self.tick >= self.next_round

    def count_step(self) -> bool:
        """Count this step on both clocks; True when a round is due (then the next is set Δ on)."""
        self.step += 1
        self.clock += self.tick
        if self.clock < self.next_round:
            return False
        self.next_round += self.cfg.interval * (1 + int((self.clock - self.next_round) // self.cfg.interval))
        return True

    # -- starting traces ------------------------------------------------------------------------
    def params(self, node: Node, max_tokens: int | None = None) -> SamplingParams:
        c = self.cfg
        return SamplingParams(temperature=node.temperature, top_p=c.top_p, top_k=c.top_k,
                              max_tokens=max_tokens or c.max_tokens, seed=derive_seed(c.seed, node.id),
                              logprobs=20 if c.method == "deepconf" else int(self.confidence),
                              decoding=c.decoding)

    def _new_node(self, parent: Node | None, temperature: float) -> Node:
        nid = len(self.nodes)
        node = Node(nid, None if parent is None else parent.id, self.step,
                    0 if parent is None else parent.depth, temperature,
                    tokens=[] if parent is None else list(parent.tokens),
                    scores=[] if parent is None else list(parent.scores))
        self.nodes[nid] = node
        self.json[nid] = NodeJSON() if parent is None else self._json(parent.id).fork()
        self.dirty.add(nid)
        self.active.add(nid)
        if self.cfg.method == "deepconf":
            self.windows[nid] = ConfidenceWindow(self.cfg.deepconf_window)
        if self.confidence:
            self.conf[nid] = ConfidenceTracker() if parent is None else self.conf[parent.id].fork()
        return node

    def key(self, node_id: int) -> str:
        return f"{self.run_id}:{node_id}"

    def _launch(self, node: Node) -> None:
        left = self.cfg.max_tokens - node.depth
        if left < 1:
            self._end(node, T.FINISHED, "length")
            return
        eid = self.engine.add(self.prompt_ids + node.tokens, self.params(node, left),
                              priority=node.rank_score(self.cfg.rank))
        node.engine_id = eid
        node.state = T.RUNNING
        self.owner[eid] = (self, node.id, node)
        self.traces[node.id] = self.engine.traces[eid]

    def start(self) -> None:
        c = self.cfg
        n = c.deepconf_warm if c.method == "deepconf" else (c.roots or c.capacity) if c.method == "gambit" \
            else c.capacity
        self._launch_roots(n)

    def _launch_roots(self, n: int) -> None:
        """``n`` fresh traces of the prompt, prefilled once (``Engine.add_samples``): each samples
        the tokens it would alone (its own seed), and the prompt's KV is held once, not n times."""
        nodes = [self._new_node(None, self.cfg.temperature) for _ in range(n)]
        if not nodes:
            return
        eids = self.engine.add_samples(self.prompt_ids, [self.params(nd) for nd in nodes],
                                       priority=nodes[0].rank_score(self.cfg.rank))
        for node, eid in zip(nodes, eids, strict=True):
            node.engine_id = eid
            node.state = T.RUNNING
            self.owner[eid] = (self, node.id, node)
            self.traces[node.id] = self.engine.traces[eid]

    def branch(self, parent: Node) -> Node:
        # compounding, x3 reached T = 5249 in eight generations (one answer in 66 traces): capped
        child = self._new_node(parent, min(parent.temperature * self.cfg.child_temperature, MAX_TEMPERATURE))
        (eid,) = self.engine.fork(parent.engine_id, 1, seeds=[derive_seed(self.cfg.seed, child.id)],
                                  temperatures=[child.temperature], priority=parent.rank_score(self.cfg.rank))
        child.engine_id = eid
        self.owner[eid] = (self, child.id, child)
        self.traces[child.id] = self.engine.traces[eid]
        if self.scorer is not None:
            self.scorer.fork(self.key(parent.id), self.key(child.id))
        self.branched += 1
        return child

    # -- ending traces --------------------------------------------------------------------------
    def _end(self, node: Node, state: str, reason: str) -> None:
        self.sync(node)
        self.traces.pop(node.id, None)
        if node.resident and node.engine_id is not None:
            self.owner.pop(node.engine_id, None)
            if reason != "eos" and reason != "stop" and reason != "length":
                try:
                    self.engine.abort(node.engine_id)
                except ValueError:
                    pass  # already gone in the engine
        node.state, node.end_reason, node.end_step = state, reason, self.step
        self.active.discard(node.id)
        if state == T.FINISHED:
            node.answer = answer_key(self.cfg.answer_rule, self.engine.tokenizer.decode(node.tokens))
            self._count(node)
        w = self.windows.get(node.id)
        if w is not None:
            node.conf_min, node.conf_mean = w.lowest_or_mean(), w.mean
        if self.scorer is not None and self.cfg.method in ("gambit", "step"):
            self.scorer.drop(self.key(node.id))
        self.conf.pop(node.id, None)
        self.dirty.add(node.id)

    def prune(self, node: Node) -> None:
        self._end(node, T.PRUNED, "pruned")
        self.pruned += 1

    def evict(self, node: Node) -> None:
        """The scheduler view dropped it (the engine did, or the driver under the KV ratio). A run's
        last resident trace is requeued instead (recompute, as vLLM preempts): runs sharing an engine
        under memory pressure took each other's, and a run left with ghosts only ended with no answer."""
        self.sync(node)  # its engine trace holds what it generated up to the eviction
        self.traces.pop(node.id, None)
        self.owner.pop(node.engine_id, None)
        self.evicted += 1
        node.evicted_step = self.step  # the lineage says so, whatever the node's end (it was lost)
        self.dirty.add(node.id)
        m = self.cfg.method
        if m in ("gambit", "step") and not self.traces:
            self._launch(node)  # waits in the engine's queue until blocks free; its place kept
            return
        if m == "gambit":
            node.state = T.GHOST  # keeps its place in the tree view until it falls into the bottom K
            node.engine_id = None
        elif m == "step":
            node.engine_id = None
            node.state, node.end_reason, node.end_step = T.EVICTED, "evicted", self.step
            self.active.discard(node.id)
            if self.scorer is not None:
                self.scorer.drop(self.key(node.id))
        else:  # sc / deepconf: recompute later, like a preempted vLLM request
            self._launch(node)

    # -- events ---------------------------------------------------------------------------------
    def sync(self, node: Node, upto: int | None = None) -> None:
        """Bring a resident node's tokens, the run's token count and the node's confidence inputs up
        to its engine trace (to its first ``upto`` tokens, prompt included: a boundary syncs to its own
        token, as routing the token events one by one had). Routing does no per-token work for them
        (at 96 traces a step that was ~120 µs of cache-cold Python); the tree view syncs where it reads
        them: rounds, writes, boundaries, a trace's end."""
        t = self.traces.get(node.id)
        if t is None:
            return
        k = len(self.prompt_ids) + len(node.tokens)  # an engine trace is the prompt + the node's tokens
        end = len(t.token_ids) if upto is None else min(upto, len(t.token_ids))
        if end <= k:
            return
        node.tokens += t.token_ids[k:end]
        self.tokens += end - k
        if self.confidence:  # every generated token's log-prob is on the trace (params.logprobs = 1)
            lps = t.logprobs[k - t.prompt_len:end - t.prompt_len]
            self.conf_of(node.id).tokens(k, lps)

    def sync_all(self) -> None:
        """``sync`` every resident node, unless the engine has not stepped since the last time: its
        traces gain tokens only in a step, and a node created since (a branch child, a relaunch)
        starts level with its engine trace. A round syncs, then its write would again (16 no-op
        calls a round, ~5% of the tournament's CPU)."""
        steps = self.engine.stats.steps
        if steps == self.synced_at:
            return
        for i in self.traces:
            self.sync(self.nodes[i])
        self.synced_at = steps

    def conf_of(self, node_id: int) -> ConfidenceTracker:
        c = self.conf.get(node_id)
        if c is None:  # a reloaded run's trace: its tracker restarts
            c = self.conf[node_id] = ConfidenceTracker()
        return c

    def on_token(self, node: Node, ev) -> None:
        """DeepConf: a token's confidence enters its window (other methods route no token events)."""
        w = self.windows.get(node.id)
        if w is not None and ev.top_logprobs:
            mean = w.push(token_confidence(ev.top_logprobs))
            if self.phase == 2 and mean is not None and mean < self.threshold:
                self._end(node, T.STOPPED, "deepconf")

    def on_finished(self, node: Node, reason: str) -> None:
        if node.resident:
            self.owner.pop(node.engine_id, None)
            own_cap = self.budget_caps.pop(node.id, None)
            if reason == "length" and own_cap is not None and self.traces[node.id].num_generated < own_cap:
                self._end(node, T.STOPPED, "limit")  # at the cap ``fit_budget`` set: the run's budget
                self.budget_cut = True
                return
            self._end(node, T.FINISHED, reason)

    def boundary_features(self, node: Node, position: int) -> list[float] | None:
        """Every boundary advances the node's confidence tracker (scored or not, the trace-level
        minimum covers all its thoughts); the features when the scorer reads them."""
        if not self.confidence:
            return None
        c = self.conf.get(node.id)
        if c is None:
            c = self.conf[node.id] = ConfidenceTracker()
        return c.boundary(position)

    def wants_score(self, node: Node) -> bool:
        m = self.cfg.method
        return node.resident and (m == "step" or (m == "gambit" and node.depth >= self.cfg.warmup))

    def on_scores(self, node: Node, scores: list[float]) -> None:
        node.scores.extend(scores)
        self.scored.add(node.id)
        if node.resident:
            try:
                self.engine.set_priority(node.engine_id, node.rank_score(self.cfg.rank))
            except ValueError:
                pass  # it ended in the engine this step (its FinishedEvent is routed next)

    def _count(self, node: Node) -> None:
        self.finished += 1
        if node.answer is not None:
            self.votes[node.answer] = self.votes.get(node.answer, 0) + 1

    def recount(self) -> None:
        """Votes and the finished count from the nodes (after a reload)."""
        self.votes, self.finished = {}, 0
        for n in self.nodes.values():
            if n.state == T.FINISHED:
                self._count(n)

    # -- rounds ---------------------------------------------------------------------------------
    def counts(self) -> tuple[int, int, int]:
        ghosts = sum(self.nodes[i].state == T.GHOST for i in self.active)
        return len(self.active), ghosts, len(self.active) - ghosts

    def tournament(self) -> tuple[int, list[int], list[list[int]]]:
        c = self.cfg  # nodes synced by ``do_round``
        if c.max_total_tokens and self.tokens >= c.max_total_tokens:
            return 0, [], []
        plan = plan_round([self.nodes[i] for i in sorted(self.active)], self.target, c.swap, c.warmup,
                          c.floor, c.rank, c.floor_refill, c.swap_ties)
        self.target -= plan.shrink
        for nid in plan.prune:
            self.prune(self.nodes[nid])
        pairs = [[pid, self.branch(self.nodes[pid]).id] for pid in plan.branch]
        return plan.case, plan.prune, pairs

    def do_round(self, kv_usage: float) -> Progress:
        t = time.perf_counter()
        self.sync_all()  # depths (eligibility), the parents' tokens a branch copies, the token count
        case, pruned, pairs = self.tournament() if self.cfg.method == "gambit" else (0, [], [])
        self.round += 1
        counts = self.counts()
        rec = RoundRecord(self.round, self.step, case, *counts, pruned, pairs, kv_usage,
                          self.tokens, time.perf_counter() - self.t0)
        self.pending_rounds.append(rec.to_dict())
        out = self.progress(kv_usage, counts)
        self.timings["tree"] += time.perf_counter() - t
        return out

    def progress(self, kv_usage: float, counts: tuple[int, int, int] | None = None) -> Progress:
        act, ghosts, res = counts or self.counts()
        return Progress(self.run_id, self.cfg.method, self.round, self.step, act, ghosts, res, self.pruned,
                        self.branched, self.evicted, self.finished, self.tokens, kv_usage, dict(self.votes),
                        time.perf_counter() - self.t0)

    def maybe_next_phase(self) -> None:
        """DeepConf: once every warm-up trace ended, set the threshold and launch the rest."""
        if self.cfg.method != "deepconf" or self.phase != 1:
            return
        if any(n.state in (T.RUNNING, T.WAITING) for n in self.nodes.values()):
            return
        lows = [n.conf_min for n in self.nodes.values()]  # set at each end; stored (a takeover keeps it)
        self.threshold = threshold(lows, self.cfg.deepconf_keep)
        self.phase = 2
        self._launch_roots(self.cfg.capacity - self.cfg.deepconf_warm)

    def is_done(self) -> bool:
        """No trace generates any more: none is resident (a node is RUNNING exactly while its engine
        trace is in ``traces``; nothing creates WAITING nodes) and DeepConf launched its second wave."""
        return not self.traces and (self.cfg.method != "deepconf" or self.phase == 2)

    def stop_all(self, state: str, reason: str) -> None:
        for i in sorted(self.active):
            self._end(self.nodes[i], state, reason)
