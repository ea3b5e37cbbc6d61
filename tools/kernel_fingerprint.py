"""Which kernels give other bits on another CPU: a hash of each operation training runs, under
``--isa compatible``'s switches, to compare between machines.

Stop 43 found the shipped models' histories part between AMD (where the cards were made) and Intel
under the same switches (docs/notes/training.md, "Stop 43"), but one machine cannot tell which kernel
rounds otherwise. This prints a short hash of each candidate's output on fixed inputs — MKL GEMMs at
the target's and drafters' shapes on 1 and 2 threads, batched GEMMs, MKL's vector math (exp, log, tanh,
sqrt, log1p), SDPA forward and backward, a GRU, RMSNorm, SiLU, softmax, an Adam step — and with
``--compare FILE`` (another machine's ``--json``) the ones that differ.

Usage: PYTHONPATH=services .venv/bin/python tools/kernel_fingerprint.py [--json FILE] [--compare FILE]
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

CHILD = "GAMBIT_FINGERPRINT_CHILD"


def digest(t) -> str:
    return hashlib.sha1(t.detach().contiguous().numpy().tobytes()).hexdigest()[:12]


def fingerprint() -> dict:
    import torch
    import torch.nn.functional as F

    from gambit.cpu_info import cpu_model, cpu_vendor

    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g)

    out: dict = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        shapes = ((400, 192, 576), (400, 192, 1024), (400, 512, 192), (192, 400, 512), (64, 576, 192))
        for rows, k, n in shapes:
            out[f"mm {rows}x{k}x{n} t{threads}"] = digest(rnd(rows, k) @ rnd(n, k).t())
        out[f"bmm 16x64x48x64 t{threads}"] = digest(torch.bmm(rnd(16, 64, 48), rnd(16, 48, 64)))
        out[f"einsum attn t{threads}"] = digest(torch.einsum("bhts,bshd->bthd", rnd(2, 4, 32, 32).softmax(-1),
                                                             rnd(2, 32, 4, 48)))
        q, kk, v = (rnd(4, 4, 128, 48).requires_grad_() for _ in range(3))
        o = F.scaled_dot_product_attention(q, kk, v, is_causal=True)
        o.backward(rnd(4, 4, 128, 48))
        out[f"sdpa fwd t{threads}"], out[f"sdpa bwd q t{threads}"] = digest(o), digest(q.grad)
    torch.set_num_threads(1)
    x = rnd(4096, 192)
    for name, fn in (("exp", torch.exp), ("log", lambda t: t.abs().log()), ("tanh", torch.tanh),
                     ("sqrt", lambda t: t.abs().sqrt()), ("log1p", lambda t: t.abs().log1p()),
                     ("sigmoid", torch.sigmoid), ("silu", F.silu), ("softmax", lambda t: t.softmax(-1)),
                     ("log_softmax", lambda t: t.log_softmax(-1)),
                     ("rms_norm", lambda t: F.rms_norm(t, (192,), None, 1e-5))):
        out[f"vector {name}"] = digest(fn(x))
    gru = torch.nn.GRU(128, 128, batch_first=True)
    with torch.no_grad():
        for p in gru.parameters():
            p.copy_(rnd(*p.shape) * 0.1)
    y, _ = gru(rnd(8, 16, 128))
    y.sum().backward()
    out["gru fwd"], out["gru bwd weight"] = digest(y), digest(gru.weight_hh_l0.grad)
    w = torch.nn.Parameter(rnd(192, 192))
    opt = torch.optim.AdamW([w], lr=1e-3, weight_decay=0.01)
    for _ in range(3):
        (w @ rnd(192, 8)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    out["adamw 3 steps"] = digest(w)
    env = {"cpu_vendor": cpu_vendor(), "cpu_model": cpu_model(), "torch": torch.__version__,
           "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    return {"environment": env, "hashes": out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default="", help="write this machine's hashes here")
    ap.add_argument("--compare", default="", help="another machine's --json file: list the ops that differ")
    a = ap.parse_args()
    if not os.environ.get(CHILD):  # the switches take effect only in a process that loads torch after them
        from gambit.train.repro import ISA_ENV

        env = {**os.environ, **ISA_ENV["compatible"], CHILD: "1"}
        return subprocess.run([sys.executable, *sys.argv], env=env).returncode
    res = fingerprint()
    print(json.dumps(res["environment"]))
    other = json.loads(open(a.compare).read()) if a.compare else None
    for op, h in res["hashes"].items():
        mark = "" if other is None else ("same" if other["hashes"].get(op) == h else "DIFFERS")
        print(f"{op:28s} {h}  {mark}")
    if other is not None:
        n = sum(other["hashes"].get(op) != h for op, h in res["hashes"].items())
        print(f"{n} of {len(res['hashes'])} differ from {other['environment']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
