"""A short CUDA check of the shipped target on a GPU machine: ``python -m gambit.bench.cuda_check``.

Runs on ``cuda``: (1) logits of our model vs ``transformers`` (fp32); (2) greedy engine output vs
``transformers.generate`` for a batch of test prompts (fp32); (3) engine throughput at a few batch
sizes (bf16, the engine's CUDA default). Prints one line per check and a JSON summary; exits 1 if a
check fails. The CPU tests cover the same ground on the CPU.
"""

from __future__ import annotations

import json
import sys
import time

import torch

from gambit.paths import TARGET


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    from transformers import AutoModelForCausalLM

    from gambit.engine import Engine, EngineConfig, SamplingParams, TokenEvent
    from gambit.model import load_model
    from gambit.tasks.arithmetic import generate

    dev, out, ok = "cuda", {"device": torch.cuda.get_device_name(0)}, True
    problems = generate("test", 32, 0)
    model, tok = load_model(TARGET, device=dev, dtype="float32")
    hf = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).to(dev).eval()
    prompts = [tok.encode(p.prompt) for p in problems]
    # (1) logits parity
    with torch.inference_mode():
        diffs = []
        for ids in prompts[:8]:
            x = torch.tensor([ids], device=dev)
            diffs.append(float((model.logits(model(x)[0][0]) - hf(x).logits[0]).abs().max()))
    out["logits_max_abs_diff_fp32"] = max(diffs)
    ok &= max(diffs) <= 1e-3
    print(f"logits fp32 max |diff| {max(diffs):.2e}")
    # (2) greedy equality, engine batch vs transformers one prompt at a time
    eng = Engine(model, tok, EngineConfig(device=dev, dtype="float32", num_blocks=2048))
    n = 48
    outs = eng.generate(prompts, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    same = 0
    for ids, got in zip(prompts, outs, strict=True):
        x = torch.tensor([ids], device=dev)
        with torch.inference_mode():
            ref = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                              eos_token_id=None, pad_token_id=tok.pad_id)[0, len(ids):].tolist()
        same += got == ref
    out["greedy_equal"] = f"{same}/{len(prompts)}"
    ok &= same == len(prompts)
    print(f"greedy equal {same}/{len(prompts)}")
    # (3) decode throughput, bf16
    del eng
    rates = {}
    for b in (1, 16, 64, 256):
        cfg = EngineConfig(model=str(TARGET), device=dev, num_blocks=4096)
        eng = Engine.from_pretrained(str(TARGET), cfg)
        sp = SamplingParams(temperature=0.8, max_tokens=128, ignore_eos=True)
        eng.generate(prompts[:min(b, 32)] * (b // 32 or 1), SamplingParams(max_tokens=4, ignore_eos=True))
        batch = (prompts * (b // len(prompts) + 1))[:b]
        for p in batch:
            eng.add(p, sp)
        torch.cuda.synchronize()
        t0, toks = time.perf_counter(), 0
        while eng.has_unfinished():
            toks += sum(isinstance(e, TokenEvent) for e in eng.step())
        torch.cuda.synchronize()
        rates[b] = toks / (time.perf_counter() - t0)
        print(f"batch {b}: {rates[b]:.0f} tok/s (bf16, prefill included)")
    out["engine_tok_s_bf16"] = rates
    out["ok"] = bool(ok)
    print(json.dumps(out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
