"""Does any layer of the shipped target's boundary state say whether its own thoughts were right?

Usage: PYTHONPATH=services .venv/bin/python tools/scorer_layer_probe.py [PROBLEMS]   (default 96)

Samples 12 traces (T = 0.8) of PROBLEMS hard (6-8 operation) train-split problems, re-runs each trace
through the target keeping every layer's state at each thought boundary ("\\n\\n" token; layer 0 is
the embedding, layer L the post-final-norm state the scorers read), and labels each boundary with
``path`` (every thought so far is the reference step). A logistic probe per layer is trained on 3/4
of the problems (class-weighted BCE) and scored on the rest: AUC over all held-out boundaries, and
within groups of one problem and one thought index (the traces a tournament round compares). The
same for the two confidence features the shipped process scorer adds (lowest sampled-token
log-probability in the thought and in the trace), alone and beside each layer.
"""

from __future__ import annotations

import sys
import time

import torch

from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.engine.events import FinishedEvent, TokenEvent
from gambit.model.loader import load_model
from gambit.paths import TARGET
from gambit.scoring.auc import auc
from gambit.scoring.confidence import ConfidenceTracker
from gambit.scoring.evaluate import grouped_auc
from gambit.scoring.rollouts import step_labels
from gambit.tasks.arithmetic import THOUGHT_SEP, TaskConfig, generate

if {"-h", "--help"} & set(sys.argv[1:]):  # the usage (the positional form read "--help" as a value)
    print(__doc__)
    sys.exit(0)

SAMPLES, CHUNK = 12, 16


def sample(model, tok, problems) -> list[tuple[int, list[int], list[int], dict[int, float]]]:
    """(problem, prompt ids, output ids, position -> sampled token log-prob) per trace."""
    cfg = EngineConfig(device="cpu", dtype="float32", seed=0, max_num_seqs=SAMPLES * CHUNK)
    eng = Engine(model, tok, cfg)
    out = []
    for c in range(0, len(problems), CHUNK):
        owner = {}
        for i, p in enumerate(problems[c:c + CHUNK]):
            for s in range(SAMPLES):
                sp = SamplingParams(temperature=0.8, max_tokens=200, seed=1000 * (c + i) + s, logprobs=1)
                owner[eng.add(p.prompt, sp)] = c + i
        lps: dict[int, dict[int, float]] = {t: {} for t in owner}
        done: dict[int, list[int]] = {}
        while len(done) < len(owner):
            for ev in eng.step():
                if isinstance(ev, TokenEvent):
                    lps[ev.trace_id][ev.position] = ev.logprob
                elif isinstance(ev, FinishedEvent):
                    done[ev.trace_id] = list(ev.output_ids)
        out += [(pi, tok.encode(problems[pi].prompt), done[t], lps[t]) for t, pi in owner.items()]
    return out


def probe(x: torch.Tensor, y: torch.Tensor, test: torch.Tensor, groups: torch.Tensor) -> tuple[float, float]:
    """Logistic probe trained on ~test rows; (AUC, within-group AUC) on the test rows."""
    mu, sd = x[~test].mean(0), x[~test].std(0) + 1e-6
    x = (x - mu) / sd
    w, b = torch.zeros(x.shape[1], requires_grad=True), torch.zeros(1, requires_grad=True)
    opt = torch.optim.Adam([w, b], lr=0.01, weight_decay=1e-3)
    yt = y[~test].float()
    pw = (1 - yt.mean()) / yt.mean()
    for _ in range(400):
        opt.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(x[~test] @ w + b, yt, pos_weight=pw).backward()
        opt.step()
    with torch.no_grad():
        s = x[test] @ w + b
    return auc(s, y[test]), grouped_auc(s, y[test], groups[test], by_pairs=True)[0]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 96
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model, tok = load_model(str(TARGET), device="cpu", dtype="float32")
    problems = generate("train", n, 5, TaskConfig(6, 8))
    t0 = time.time()
    traces = sample(model, tok, problems)
    sep = tok.encode(THOUGHT_SEP)[-1]  # one token (encode puts BOS first)
    L = model.config.num_hidden_layers
    states: list[list[torch.Tensor]] = [[] for _ in range(L + 1)]
    labels, conf, groups = [], [], []
    with torch.no_grad():
        for pi, pids, out, lp in traces:
            _, taps = model(torch.tensor([pids + out]), taps=tuple(range(L + 1)))
            text = tok.decode(out)
            bounds = [len(pids) + i for i, t in enumerate(out) if t == sep][:text.count(THOUGHT_SEP)]
            _, on_path = step_labels(text, problems[pi], len(bounds))
            tracker = ConfidenceTracker()
            for q in range(len(pids), len(pids) + len(out)):
                tracker.token(q, lp.get(q))
            for j, pos in enumerate(bounds):
                for layer in range(L + 1):
                    states[layer].append(taps[layer][0, pos])
                conf.append(tracker.boundary(pos))
                groups.append(pi * 1000 + j)  # one problem, one thought index
            labels += torch.cumprod(on_path.long(), 0).bool().tolist()  # every thought so far on the path
    y, c, groups = torch.tensor(labels), torch.tensor(conf), torch.tensor(groups)
    test = groups // 1000 % 4 == 0
    print(f"{len(traces)} traces, {len(labels)} boundaries ({100 * float(y.float().mean()):.1f}% on the "
          f"reference path), {time.time() - t0:.0f} s; held out: {int(test.sum())} boundaries")
    print("| probe input | AUC | within problem and thought | with the confidence features: AUC | within |")
    print("|---|---:|---:|---:|---:|")
    a, w = probe(c, y, test, groups)
    print(f"| confidence features only | {a:.3f} | {w:.3f} | | |")
    for layer in range(L + 1):
        x = torch.stack(states[layer])
        a, w = probe(x, y, test, groups)
        a2, w2 = probe(torch.cat([x, c], 1), y, test, groups)
        name = "embedding" if layer == 0 else f"layer {layer}"
        name += " (post-norm, what the scorers read)" if layer == L else ""
        print(f"| {name} | {a:.3f} | {w:.3f} | {a2:.3f} | {w2:.3f} |", flush=True)


if __name__ == "__main__":
    main()
