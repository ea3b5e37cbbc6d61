"""Speculative traces in the engine: lossless at temperature 0 (batch 1 and 8, forks, preemption,
eviction), the target distribution at temperature > 0, events, stats, and no KV block leaks."""

from __future__ import annotations

import math

import pytest
import torch

from gambit.engine import (
    BoundaryEvent,
    Engine,
    EngineConfig,
    EvictedEvent,
    FinishedEvent,
    SamplingParams,
    TokenEvent,
)
from gambit.engine.config import SpecConfig
from gambit.speculative import random_drafter
from gambit.tasks.arithmetic import TaskConfig, generate

SMALL = SpecConfig(gamma=3, budget=12, grow_width=3, offer_width=3, reconsider=2, max_batch=0)
METHODS = ["eagle", "pr"]
NEW = 40


def _engine(target, spec=SMALL, **kw) -> Engine:
    model, tok = target
    kw.setdefault("num_blocks", 512)
    eng = Engine(model, tok, EngineConfig(device="cpu", dtype="float32", spec=spec, **kw))
    eng.register_drafter("eagle", random_drafter(eng.model, seed=1))
    eng.register_drafter("pr", random_drafter(eng.model, seed=2, method="pr"))
    return eng


def _prompts(tok) -> list[list[int]]:
    ps = [tok.encode(p.prompt) for p in generate("test", 10, 3, TaskConfig(2, 8))]
    return ps + [tok.encode("Compute 1+1.\nSolution:\n1+1=2\n\n"), [tok.bos_id]]


def _params(decoding, **kw):
    kw.setdefault("max_tokens", NEW)
    return SamplingParams(temperature=0, decoding=decoding, **kw)


def _drain(eng, check=True, max_steps=5000):
    events = []
    for _ in range(max_steps):
        if not eng.has_unfinished():
            return events
        events += eng.step()
        if check:  # block accounting stays exact; tree slots never outlive their cycle
            live = [t for t in eng.traces.values() if not t.is_done]
            eng.blocks.check(live)
            for t in live:
                assert len(t.block_table) <= eng.blocks.blocks_for(len(t.token_ids)), t.id
    raise AssertionError("engine still busy")


@pytest.fixture(scope="module")
def reference(target):
    """Plain greedy outputs and events, batch 8+ at once."""
    eng = _engine(target)
    prompts = _prompts(target[1])
    ids = [eng.add(p, _params("plain")) for p in prompts]
    events = _drain(eng, check=False)
    fin = {e.trace_id: e for e in events if isinstance(e, FinishedEvent)}
    outs = [list(fin[i].output_ids) for i in ids]
    bounds = [[(e.position, e.hidden) for e in events if isinstance(e, BoundaryEvent) and e.trace_id == i]
              for i in ids]
    return prompts, outs, bounds


@pytest.mark.parametrize("method", METHODS)
def test_greedy_equals_plain_batch8(target, reference, method):
    prompts, refs, bounds = reference
    eng = _engine(target)
    ids = [eng.add(p, _params(method)) for p in prompts]
    events = _drain(eng)
    fin = {e.trace_id: e for e in events if isinstance(e, FinishedEvent)}
    for k, tid in enumerate(ids):
        assert list(fin[tid].output_ids) == refs[k], f"prompt {k}"
        toks = [e for e in events if isinstance(e, TokenEvent) and e.trace_id == tid]
        assert [e.token_id for e in toks] == refs[k]
        assert [e.position for e in toks] == list(range(len(prompts[k]), len(prompts[k]) + len(refs[k])))
        got = [(e.position, e.hidden) for e in events if isinstance(e, BoundaryEvent) and e.trace_id == tid]
        assert [p for p, _ in got] == [p for p, _ in bounds[k]]
        for (_, a), (_, b) in zip(got, bounds[k], strict=True):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    s = eng.stats
    assert s.spec_drafts > 0 and s.tau >= 1.0 and s.spec_draft_tokens == s.spec_drafts * SMALL.budget
    assert set(ids) <= set(s.trace_tau) and all(v >= 1 for v in s.trace_tau.values())
    assert eng.blocks.num_free == eng.num_blocks
    eng.blocks.check([])


@pytest.mark.parametrize("method", METHODS)
def test_batch_cap_decodes_plainly_then_drafts_again(target, reference, method):
    """Above ``spec.max_batch`` traces a step decodes plainly; the drafter's context stays current,
    so once enough traces finish the rest draft again, and every output is still plain greedy. The
    shipped drafters, not random ones: a trained drafter on a current context accepts most of its
    tokens, where a random one may accept none."""
    from gambit.paths import DRAFTER_EAGLE31, DRAFTER_PR
    from gambit.speculative import load_drafter

    prompts, refs, _ = reference
    short = [_params(method, max_tokens=n) for n in (8, 8, 8, NEW, NEW)]  # 5 traces, then 2
    eng = _engine(target, spec=SpecConfig(gamma=3, budget=12, grow_width=3, offer_width=3, reconsider=2,
                                          max_batch=2))
    eng.register_drafter(method, load_drafter(DRAFTER_PR if method == "pr" else DRAFTER_EAGLE31, eng.model))
    ids = [eng.add(p, sp) for p, sp in zip(prompts[:5], short, strict=True)]
    drafts_while_big = None
    for _ in range(5000):
        if not eng.has_unfinished():
            break
        busy = sum(not t.is_done for t in eng.traces.values())
        before = eng.stats.spec_drafts
        events = eng.step()
        if busy > 2:
            drafts_while_big = (drafts_while_big or 0) + eng.stats.spec_drafts - before
        for e in events:
            if isinstance(e, FinishedEvent):
                k = ids.index(e.trace_id)
                assert list(e.output_ids) == refs[k][:short[k].max_tokens], f"prompt {k}"
    s = eng.stats
    assert drafts_while_big == 0 and s.spec_capped_steps >= 7  # 5 traces: plain steps only
    # two left: drafting resumed on a current context (τ 4.1-4.4 here; a stale one would accept little)
    assert s.spec_drafts > 0 and s.tau > 2.0, s.tau
    assert eng.blocks.num_free == eng.num_blocks
    with pytest.raises(ValueError, match="max_batch"):
        SpecConfig(max_batch=-1)


@pytest.mark.parametrize("method", METHODS)
def test_greedy_equals_plain_batch1_default_tree(target, reference, method):
    """One trace at a time, the paper's tree (B = 48, gamma = 5, m = 3; the benchmark's headline)."""
    prompts, refs, _ = reference
    eng = _engine(target, spec=SpecConfig(gamma=5, budget=48, grow_width=6, offer_width=6, reconsider=3))
    for k in (0, 11):
        assert eng.generate([prompts[k]], _params(method))[0] == refs[k]
    assert eng.stats.max_batch_size == 1 and eng.stats.spec_drafts > 0
    assert eng.blocks.num_free == eng.num_blocks


def test_greedy_equals_plain_with_miss_selection(target, reference):
    """``spec.select = "miss"`` (rows picked by path probability x mass outside their offers, the Python
    tree) at batch 8: every output is still plain greedy, no block leaks."""
    prompts, refs, _ = reference
    eng = _engine(target, spec=SpecConfig(gamma=3, budget=12, grow_width=3, offer_width=3, reconsider=2,
                                          max_batch=0, select="miss"))
    assert eng.generate(prompts[:8], _params("pr")) == refs[:8]
    assert eng.stats.spec_drafts > 0 and eng.stats.max_batch_size == 8
    assert eng.blocks.num_free == eng.num_blocks
    with pytest.raises(ValueError, match="spec.select"):
        SpecConfig(select="random")


@pytest.mark.parametrize("method", METHODS)
def test_greedy_with_forks_and_preemption(target, reference, method):
    """Small cache: traces are preempted and re-prefilled mid-run; children forked mid-run from
    speculative parents inherit their drafter state and still decode the plain greedy text."""
    prompts, refs, _ = reference
    eng = _engine(target, block_size=4, num_blocks=150, max_num_batched_tokens=128)
    ids = [eng.add(p, _params(method)) for p in prompts[:8]]
    events = []
    for _ in range(4):
        events += eng.step()
    kids = {}
    for k, tid in enumerate(ids[:4]):
        if tid in eng.traces and not eng.get(tid).is_done:
            kids[eng.fork(tid, 1)[0]] = k
    events += _drain(eng)
    fin = {e.trace_id: e for e in events if isinstance(e, FinishedEvent)}
    for k, tid in enumerate(ids):
        assert list(fin[tid].output_ids) == refs[k], f"prompt {k}"
    for cid, k in kids.items():
        assert list(fin[cid].output_ids) == refs[k], f"child of prompt {k}"
    assert eng.stats.preemptions > 0 and eng.stats.spec_drafts > 0 and kids
    assert eng.blocks.num_free == eng.num_blocks
    eng.blocks.check([])


def test_eviction_abort_priorities(target, reference):
    prompts, refs, _ = reference
    eng = _engine(target, block_size=4, num_blocks=90, preemption="evict")
    ids = [eng.add(p, _params("pr"), priority=float(i)) for i, p in enumerate(prompts[:8])]
    events = eng.step() + eng.step()
    eng.set_priority(ids[0], 100.0)
    eng.abort(ids[1])
    events += _drain(eng)
    done = {e.trace_id: e for e in events if isinstance(e, FinishedEvent | EvictedEvent)}
    assert isinstance(done[ids[1]], FinishedEvent) and done[ids[1]].reason == "abort"
    assert any(isinstance(e, EvictedEvent) for e in done.values())
    for k, tid in enumerate(ids):
        out = list(done[tid].output_ids)
        assert out == refs[k][:len(out)]  # evicted / aborted: a prefix of the greedy text
    assert eng.blocks.num_free == eng.num_blocks


def test_bad_decoding_names(target):
    eng = _engine(target)
    with pytest.raises(ValueError, match="no drafter"):
        eng.add("Compute 1+1.\n", SamplingParams(decoding="/nonexistent/drafter"))
    with pytest.raises(ValueError, match="decoding"):
        SamplingParams(decoding="")
    with pytest.raises(ValueError, match="spec.budget"):
        SpecConfig(budget=0)
    assert not eng.traces


def _chi2_999(df: int) -> float:
    z = 3.09  # Wilson-Hilferty approximation of the 99.9% quantile
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_sampling_matches_target_distribution(tiny):
    """T = 1: the second token (the first one verification emits), given the first, follows the
    model's own conditional distribution."""
    model, tok = tiny
    eng = Engine(model, tok, EngineConfig(device="cpu", dtype="float32", num_blocks=2048,
                                          spec=SpecConfig(gamma=2, budget=8, grow_width=2, offer_width=3,
                                                          reconsider=1, verify="rejection", max_batch=0)))
    eng.register_drafter("pr", random_drafter(eng.model, seed=3, method="pr", std=0.5))
    prompt = tok.encode("Compute 12+7.\nSolution:\n")
    n = 1500
    outs = eng.generate([prompt] * n, [SamplingParams(temperature=1.0, max_tokens=2, seed=i, decoding="pr",
                                                      ignore_eos=True) for i in range(n)])
    assert eng.stats.spec_drafts >= n
    firsts = torch.tensor([o[0] for o in outs])
    t1 = int(torch.bincount(firsts).argmax())
    seconds = torch.tensor([o[1] for o in outs if o[0] == t1])
    with torch.no_grad():
        hidden, _ = model(torch.tensor([prompt + [t1]]))
        p = torch.softmax(model.logits(hidden[0, -1]).double(), -1)
    expected = p * len(seconds)
    counts = torch.bincount(seconds, minlength=len(p)).double()
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    chi2 = float(((obs - exp) ** 2 / exp.clamp(min=1e-9)).sum())
    assert len(seconds) > 100
    assert chi2 < _chi2_999(int(big.sum())), chi2


@pytest.mark.parametrize("method", ["eagle3.1", "pr"])
def test_match_verify_samples_exactly_plain_decoding(target, method):
    """``spec.verify = "match"`` at T > 0 (top-k and top-p on some rows), the shipped drafters: the
    same tokens as plain sampling with the same seeds, at batch 8 and for children forked after the
    prompt (their own seeds), with many draft tokens accepted."""
    prompts = _prompts(target[1])[:8]
    spec = SpecConfig(gamma=3, budget=12, grow_width=3, offer_width=3, reconsider=2, verify="match",
                      max_batch=0)  # 8 traces and 2 children: above the default cap
    model, tok = target

    def params(i, decoding):
        return SamplingParams(temperature=0.8, top_k=20 if i % 3 == 1 else 0,
                              top_p=0.9 if i % 3 == 2 else 1.0, seed=100 + i, max_tokens=NEW,
                              decoding=decoding, ignore_eos=True)

    runs = []
    for decoding in ("plain", method):
        eng = Engine(model, tok, EngineConfig(device="cpu", dtype="float32", spec=spec, num_blocks=512))
        ids = [eng.add(p, params(i, decoding)) for i, p in enumerate(prompts)]
        events = eng.step()  # the prompts: one token each, in both engines
        kids = [eng.fork(ids[k], 1, seeds=[500 + k])[0] for k in (0, 5)]
        events += _drain(eng)
        fin = {e.trace_id: list(e.output_ids) for e in events if isinstance(e, FinishedEvent)}
        runs.append(([fin[i] for i in ids + kids], eng.stats))
    (plain, _), (spec_out, stats) = runs
    assert spec_out == plain
    assert stats.spec_drafts > 0 and stats.tau > 2.0, stats.tau


def test_match_verify_is_refused_unless_known():
    with pytest.raises(ValueError, match="spec.verify"):
        SpecConfig(verify="typical")


def _reduced_drafter(model, seed: int, method: str, vd: int = 40):
    """A random drafter over ``vd`` of the target's ids (spread over the vocabulary, ascending)."""
    d = random_drafter(model, seed=seed, method=method, draft_vocab_size=vd)
    ids = torch.linspace(0, model.config.vocab_size - 1, vd).long()
    d.d2t.copy_(ids - torch.arange(vd))
    d.t2d.zero_()
    d.t2d[ids] = True
    return d


@pytest.mark.parametrize("method", METHODS)
def test_reduced_draft_vocabulary_is_lossless(target, reference, method):
    """A drafter over part of the vocabulary (d2t/t2d, as trained for a real model) drafts target ids
    through its map; greedy output still equals plain decoding at batch 8."""
    prompts, refs, _ = reference
    eng = _engine(target)
    eng.register_drafter("reduced", _reduced_drafter(eng.model, 7, "pr" if method == "pr" else "eagle3.1"))
    ids = [eng.add(p, _params("reduced")) for p in prompts]
    fin = {e.trace_id: e for e in _drain(eng) if isinstance(e, FinishedEvent)}
    assert [list(fin[t].output_ids) for t in ids] == refs
    assert eng.stats.spec_drafts > 0 and eng.blocks.num_free == eng.num_blocks


@pytest.mark.parametrize("method", ["eagle3.1", "pr"])
def test_add_samples_speculative_equals_plain_separate_adds(target, method):
    """``Engine.add_samples`` with a drafter: the followers inherit the leader's prompt taps (the
    drafter's context) with its KV, so they draft from their first cycle and still emit exactly what
    plain decoding of separately added traces emits (T = 0.8, match verification)."""
    model, tok = target
    prompt = _prompts(tok)[0]
    spec = SpecConfig(gamma=3, budget=12, grow_width=3, offer_width=3, reconsider=2, verify="match",
                      max_batch=0)

    def params(i, decoding):
        return SamplingParams(temperature=0.8, seed=300 + i, max_tokens=NEW, decoding=decoding,
                              ignore_eos=True)

    outs = []
    for decoding, shared in (("plain", False), (method, True)):
        eng = Engine(model, tok, EngineConfig(device="cpu", dtype="float32", spec=spec, num_blocks=512))
        ps = [params(i, decoding) for i in range(4)]
        ids = eng.add_samples(prompt, ps) if shared else [eng.add(prompt, p) for p in ps]
        fin = {e.trace_id: list(e.output_ids) for e in _drain(eng) if isinstance(e, FinishedEvent)}
        outs.append(([fin[i] for i in ids], eng.stats))
    (plain, _), (spec_out, stats) = outs
    assert spec_out == plain
    assert stats.shared_prompt_tokens == 3 * len(prompt)
    assert stats.spec_drafts > 0 and stats.tau > 2.0, stats.tau
    assert set(stats.trace_tau) >= set(range(1, 4))  # the followers drafted too


def test_kv_budget_covers_drafter_caches_and_the_tap_buffer(target):
    """A budget-sized engine (how CUDA runs: ~all free memory) must hold every tensor speculative
    decoding allocates per KV slot, its reserved drafters' caches and the tap buffer, within the budget:
    on an H200 the tap buffer (3 hidden states per slot) was left out and ran the card out of memory."""
    model, tok = target
    budget, fraction = 64 << 20, 0.9
    eng = Engine(model, tok, EngineConfig(device="cpu", dtype="float32", spec=SMALL, kv_memory_bytes=budget,
                                          kv_fraction=fraction))
    eng.register_drafter("eagle", random_drafter(eng.model, seed=1))
    eng.register_drafter("pr", random_drafter(eng.model, seed=2, method="pr"))
    eng.generate(_prompts(tok)[:2], _params("pr", max_tokens=8))
    spec = eng.speculator()
    caches = [eng.runner.cache, *spec.caches.values()]
    used = sum(c.k.nbytes + c.v.nbytes for c in caches) + sum(b.nbytes for b in spec.tap_buffers.values())
    assert spec.tap_buffers, "the PR run wrote no taps"
    assert budget * fraction * 0.99 <= used <= budget * fraction  # all of the budget, and no more


def test_shipped_names_and_every_spelling_of_a_folder_load_one_drafter(target):
    """"hass+pr" looked for drafter-hass+pr (it ships as drafter-hass-pr); and each spelling of one folder
    loaded another drafter with its own KV cache (seven spellings held more KV than the target)."""
    from gambit.paths import DRAFTER_PR

    model, tok = target
    eng = Engine(model, tok, EngineConfig(device="cpu", dtype="float32", spec=SMALL, num_blocks=256))
    spellings = ["pr", str(DRAFTER_PR), str(DRAFTER_PR) + "/", str(DRAFTER_PR / ".." / DRAFTER_PR.name)]
    keys = {eng.speculator().prepare(s) for s in spellings}
    assert keys == {"pr"} and len(eng.speculator().drafters) == 1
    assert eng.speculator().prepare("hass+pr") == "hass+pr"
    prompt = tok.encode(generate("test", 1, 5, TaskConfig(3, 3))[0].prompt)
    outs = {}
    for dec in ("plain", str(DRAFTER_PR) + "/", "hass+pr"):
        tid = eng.add(prompt, _params(dec, max_tokens=24))
        outs[dec] = next(list(e.output_ids) for e in _drain(eng) if isinstance(e, FinishedEvent)
                         and e.trace_id == tid)
    assert outs[str(DRAFTER_PR) + "/"] == outs["plain"] == outs["hass+pr"]  # lossless, whichever drafter
    assert len(eng.speculator().drafters) == 2


@pytest.mark.parametrize("field, value", [("seed", 2**63), ("seed", 2**64), ("seed", True), ("top_k", 2**63)])
def test_a_seed_or_top_k_the_sampler_cannot_take_is_refused_at_add(field, value):
    """2**63 passed the check and failed inside the next step, after other traces had advanced: every
    later step failed too."""
    with pytest.raises(ValueError, match=f"^{field} must be an integer in \\[0, 2\\*\\*63\\)"):
        SamplingParams(**{field: value})
    SamplingParams(**{field: 2**63 - 1})
