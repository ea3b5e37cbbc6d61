"""One draw of the Python sampler (``sampler.sample``) against the compiled one (``cpu_sampler.sample``)
at B rows of V symbols (T = TEMP, default 0.8; no top-k/top-p), interleaved, REPS rounds of N calls each;
median and range of µs per draw, and whether the tokens agree. Then the whole sampling step as the engine
takes it, the draw and the chosen tokens' top-1 log-probabilities from Python lists of settings: the
ATen path (``SamplingBatch.build``, the compiled draw, ``top_logprobs``, ``tolist``) against the
plain-loop step (``cpu_sample_step.step_kernel``, where its probes pass), with the same comparison.
Last, a greedy draw (and a greedy verification's argmax over a tree's rows): ATen's ``argmax(-1)``
against the compiled ``cpu_sampler.argmax``, and whether their indices agree.

With TOP > 1 the step asks for the TOP largest log-probabilities too (DeepConf's 20), and the top-k
alone is timed both ways: ATen's ``topk`` against the compiled heap (``topk_rows``, where it serves).

With TOP_P < 1 the draw is also timed with a nucleus (every row top-p TOP_P): the Python sampler against
the compiled one; the filter alone (``sampler.filter_logits``, ATen's stable sort of whole rows, against
``cpu_filter``, which ranks only the entries above a threshold); the plain-loop step with the nucleus; and
the sorts alone (ATen's default, ATen's stable, the radix sort); and ``torch.exp`` (MKL's) over a block of
finite values, of -inf and of -120 (an underflow). SCALE multiplies the standard-normal
logits: 1 (default) leaves ~32,000 of 49,152 entries in a 0.95 nucleus at T = 0.8, 4 ~1,000 (a peaked row,
nearer a language model's).

A low TEMP makes cold rows: entries more than ~104 below a row's maximum after the temperature underflow
to 0, which MKL's exp reaches by a slow path; the step skips exp for them where a row has enough (the
share of such entries is printed).

Usage: .venv/bin/python tools/sampler_speed.py [B] [V] [REPS] [TOP] [TOP_P] [SCALE] [TEMP]
       (default 96 100 5 1 1.0 1 0.8), e.g. ``16 49152`` / ``64 49152`` / ``49 49152``: SmolLM2-135M's
       vocabulary at batch 16 / 64 / a B = 48 tree; ``64 49152 3 20``: DeepConf's top 20 at batch 64;
       ``16 49152 3 1 0.95``: top-p 0.95; ``64 49152 3 1 0.95 4``: a peaked nucleus; ``64 49152 3 1 1.0 4
       0.1``: cold rows (2 threads)
"""
import statistics
import sys
import time

import torch

from gambit.engine import cpu_attention, cpu_filter, cpu_sample_step, cpu_sampler
from gambit.engine.sampler import CDF_BLOCK, SamplingBatch, filter_logits, sample, top_logprobs

if {"-h", "--help"} & set(sys.argv[1:]):  # the usage (the positional form read "--help" as a value)
    print(__doc__)
    sys.exit(0)

B = int(sys.argv[1]) if len(sys.argv) > 1 else 96
V = int(sys.argv[2]) if len(sys.argv) > 2 else 100
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
top = int(sys.argv[4]) if len(sys.argv) > 4 else 1
top_p = float(sys.argv[5]) if len(sys.argv) > 5 else 1.0
scale = float(sys.argv[6]) if len(sys.argv) > 6 else 1.0
temp = float(sys.argv[7]) if len(sys.argv) > 7 else 0.8
torch.set_num_threads(2)
logits = torch.randn(B, V, generator=torch.Generator().manual_seed(0)) * scale
temps, top_ks, top_ps, seeds, counters = [temp] * B, [0] * B, [1.0] * B, list(range(B)), [50] * B
sb = SamplingBatch.build(temps, top_ks, top_ps, seeds, counters, torch.device("cpu"))
n = max(10, 30_000 // V)
step = cpu_sample_step.step_kernel(torch.device("cpu"), V)


def aten_step():
    batch = SamplingBatch.build(temps, top_ks, top_ps, seeds, counters, torch.device("cpu"))
    tokens = cpu_sampler.sample(logits, batch)
    chosen, vals, ids = top_logprobs(logits, tokens, top)
    return tokens.tolist(), chosen.tolist(), vals.tolist(), ids.tolist()


def loop_step():
    tokens, chosen, vals, ids = step(logits, temps, seeds, counters, top, top, CDF_BLOCK, [], [])
    return tokens, chosen, vals.tolist(), ids.tolist()


cases = {"python": lambda: sample(logits.clone(), sb),
         "compiled": lambda: cpu_sampler.sample(logits.clone(), sb), "step, ATen calls": aten_step,
         "greedy argmax, ATen": lambda: logits.argmax(-1),
         "greedy argmax, compiled": lambda: cpu_sampler.argmax(logits)}
if step is not None:
    cases["step, plain loops"] = loop_step
if top_p < 1:
    nucleus = SamplingBatch.build(temps, top_ks, [top_p] * B, seeds, counters, torch.device("cpu"))
    cases[f"top-p {top_p} draw, python"] = lambda: sample(logits.clone(), nucleus)
    cases[f"top-p {top_p} draw, compiled"] = lambda: cpu_sampler.sample(logits, nucleus)
    scaled, ks, ps = logits / temp, torch.zeros(B, dtype=torch.long), torch.full((B,), top_p)
    cases[f"top-p {top_p} filter, python"] = lambda: filter_logits(scaled, ks, ps)
    cases[f"top-p {top_p} filter, compiled"] = lambda: cpu_filter.filter_logits(scaled, ks, ps)
    # why the step passes only the kept entries to exp: at::exp (MKL's) of -inf or of an underflow is slow
    exp_in = {"finite": logits / temp - 10, "-inf": torch.full_like(logits, float("-inf")),
              "-120 (underflow)": torch.full_like(logits, -120.0)}
    for what, x in exp_in.items():
        cases[f"at::exp of {B}x{V} floats, {what}"] = lambda x=x: torch.exp(x)
    if step is not None:
        cases[f"top-p {top_p} step, plain loops"] = lambda: step(logits, temps, seeds, counters, 1, 1,
                                                                 CDF_BLOCK, [0] * B, [top_p] * B)
    cases["sort, ATen"] = lambda: logits.sort(dim=-1, descending=True)
    radix = getattr(cpu_attention.kernel(), "sort_desc_rows", None)
    if radix is not None:
        cases["stable sort, ATen"] = lambda: logits.sort(dim=-1, descending=True, stable=True)
        cases["stable sort, radix"] = lambda: radix(logits)
lsm = torch.log_softmax(logits, -1)
compiled_topk = getattr(cpu_attention.kernel(), "topk_rows", None) if top > 1 else None
if compiled_topk is not None and compiled_topk(lsm, top)[0].numel() > 0:
    cases[f"top-{top}, ATen"] = lambda: lsm.topk(top, -1)
    cases[f"top-{top}, compiled"] = lambda: compiled_topk(lsm, top)
times: dict[str, list[float]] = {k: [] for k in cases}
shifted = logits / temp - (logits / temp).max(-1, keepdim=True).values
denormal = ((shifted < -87.3) & (shifted > -104)).float().mean().item()
print(f"T = {temp}: {(shifted <= -104).float().mean().item():.1%} of entries underflow to 0 (<= -104 below "
      f"their row's maximum), {denormal:.1%} to denormals")
same = torch.equal(cases["python"](), cases["compiled"]())
nucleus_draws = [cases[f"top-p {top_p} draw, {x}"]() for x in ("python", "compiled")] if top_p < 1 else []
same_nucleus = not nucleus_draws or torch.equal(*nucleus_draws)
if top_p < 1:
    filtered = [cases[f"top-p {top_p} filter, {x}"]() for x in ("python", "compiled")]
    same_nucleus = same_nucleus and torch.equal(*filtered)
    kept = filtered[1].isfinite().sum(1).float()
    print(f"top-p {top_p} nucleus: {kept.median():.0f} entries a row (median; "
          f"{kept.min():.0f}-{kept.max():.0f})")
same_step = step is None or aten_step() == loop_step()
same_argmax = torch.equal(logits.argmax(-1), cpu_sampler.argmax(logits))
topk_pair = [cases[f"top-{top}, {side}"]() for side in ("ATen", "compiled") if f"top-{top}, {side}" in cases]
# values only: the compiled heap orders ties by ascending id (stop 66), ATen's order among ties moves with k
same_topk = len(topk_pair) < 2 or torch.equal(topk_pair[0][0], topk_pair[1][0])
for _ in range(reps):
    for name, f in cases.items():
        for _ in range(3):
            f()
        t = time.perf_counter()
        for _ in range(n):
            f()
        times[name].append(1e6 * (time.perf_counter() - t) / n)
for name, ts in times.items():
    print(f"{name}: {statistics.median(ts):.1f} µs per call ({min(ts):.1f}-{max(ts):.1f}), B={B} V={V}")
print(f"same tokens (draw): {same}; same tokens and log-probabilities (step): {same_step}"
      + ("" if step is not None else " (the plain-loop step does not serve here)")
      + f"; same indices (argmax): {same_argmax}"
      + (f"; same top-{top} values: {same_topk}" if top > 1 else "")
      + (f"; same top-p draws and filtered logits: {same_nucleus}" if top_p < 1 else ""))
