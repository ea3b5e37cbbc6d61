"""What one bfloat16 product of a few rows costs through oneDNN (the engine's ``onednn-bf16`` path:
``mkldnn::_linear_pointwise`` on a packed weight, the row rounded to bfloat16 and the output widened
back) against ATen's brgemm micro-kernel (``at::native::cpublas::brgemm``, the one CPU flash attention
uses: fp32 output, no conversion of it) and MKL's ``cblas_gemm_bf16bf16f32`` (exported by libtorch_cpu;
B unpacked: MKL packs it inside each call), at SmolLM2-135M's shapes and a tiny one that shows the fixed
cost of a call. Each is timed warm (one weight, cache-resident) and cold (40 distinct weights in turn,
as a decode step reads its layers), best of 5 passes, 2 threads. The brgemm side is a plain prototype:
weight columns packed (VNNI) in blocks of ``--block``, the blocks split over the threads, no prefetch.

Why: a decode step of SmolLM2 makes 121 such calls; on an Intel Xeon with AMX oneDNN's call costs
~20 µs before any arithmetic (the 64 x 64 row), a brgemm call ~3 µs.

Usage: .venv/bin/python tools/bf16_linear_calls.py [--block 64] [--rows 16,64] [--json PATH]
"""
import argparse
import json
import time

import torch
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
// w [N, K] bfloat16 -> [N / nb, K, nb]: each block of nb output columns packed for brgemm
torch::Tensor pack_w(torch::Tensor w, int64_t nb) {
  const int64_t N = w.size(0), K = w.size(1);
  auto wt = w.t().contiguous();
  auto out = torch::empty({N / nb, K, nb}, w.options());
  const at::BFloat16* src = wt.data_ptr<at::BFloat16>();
  for (int64_t b = 0; b < N / nb; ++b)
    at::native::cpublas::pack(K, nb, N, nb, at::kBFloat16, at::kBFloat16, src + b * nb,
                              out.data_ptr<at::BFloat16>() + b * K * nb);
  return out;
}
extern "C" void cblas_gemm_bf16bf16f32(int, int, int, int, int, int, float, const uint16_t*, int,
                                       const uint16_t*, int, float, float*, int);
// x [M, K] fp32, w [N, K] bfloat16 -> x (rounded to bfloat16) @ w.T in fp32 through MKL (row-major, B^T)
torch::Tensor mkl_linear(torch::Tensor x, torch::Tensor w) {
  const int M = x.size(0), K = x.size(1), N = w.size(0);
  auto xb = x.to(at::kBFloat16);
  auto y = torch::empty({M, N}, x.options());
  cblas_gemm_bf16bf16f32(101, 111, 112, M, N, K, 1.f, reinterpret_cast<const uint16_t*>(xb.data_ptr()), K,
                         reinterpret_cast<const uint16_t*>(w.data_ptr()), K, 0.f, y.data_ptr<float>(), N);
  return y;
}
// x [M, K] fp32 -> x (rounded to bfloat16) @ w.T in fp32, [M, N]
torch::Tensor linear(torch::Tensor x, torch::Tensor packed) {
  const int64_t M = x.size(0), K = x.size(1), blocks = packed.size(0), nb = packed.size(2), N = blocks * nb;
  auto xb = x.to(at::kBFloat16);
  auto y = torch::empty({M, N}, x.options());
  const at::BFloat16* a = xb.data_ptr<at::BFloat16>();
  const at::BFloat16* pb = packed.data_ptr<at::BFloat16>();
  float* c = y.data_ptr<float>();
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      at::native::cpublas::brgemm(M, nb, K, K, nb, N, false, a, pb + b * K * nb, c + b * nb, true);
    at::native::cpublas::brgemm_release(true);
  });
  return y;
}
"""

# [in, out]: a tiny one (the fixed cost of a call), then SmolLM2's qkv, o, gate_up and down
SHAPES = [(64, 64), (576, 960), (576, 576), (576, 3072), (1536, 576)]


def best(fn, n: int) -> float:
    for _ in range(max(1, n // 10)):
        fn()
    out = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out = min(out, (time.perf_counter() - t0) / n * 1e6)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--block", type=int, default=64, help="output columns per packed brgemm block")
    ap.add_argument("--rows", default="16,64", help="comma-separated row counts M (the decode batch)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--json", default="", help="also write the rows here (a path; empty: print only)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ext = load_inline("gambit_bf16_linear_calls", SOURCE, functions=["pack_w", "linear", "mkl_linear"],
                      extra_cflags=["-O3"])
    rows = []
    print(f"{'M':>3} {'[in, out]':>12} | onednn warm / cold µs | brgemm warm / cold µs | mkl warm / cold µs "
          "| max |diff|")
    for k, n in SHAPES:
        ws = [torch.randn(n, k).bfloat16() for _ in range(40)]
        dnn = [torch.ops.mkldnn._reorder_linear_weight(w, 16) for w in ws]
        brg = [ext.pack_w(w, args.block) for w in ws]
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k)

            def one_dnn(p, x=x):
                return torch.ops.mkldnn._linear_pointwise(x.bfloat16(), p, None, "none", [], "").float()

            ref = x.bfloat16().float() @ ws[0].float().t()
            diff = (ext.linear(x, brg[0]) - ref).abs().max().item()
            mdiff = (ext.mkl_linear(x, ws[0]) - ref).abs().max().item()
            r = {"rows": m, "in": k, "out": n,
                 "onednn_warm_us": best(lambda d=dnn: one_dnn(d[0]), 400),
                 "onednn_cold_us": best(lambda d=dnn: [one_dnn(p) for p in d], 10) / len(dnn),
                 "brgemm_warm_us": best(lambda x=x, b=brg: ext.linear(x, b[0]), 400),
                 "brgemm_cold_us": best(lambda x=x, b=brg: [ext.linear(x, p) for p in b], 10) / len(brg),
                 "mkl_warm_us": best(lambda x=x, w=ws: ext.mkl_linear(x, w[0]), 400),
                 "mkl_cold_us": best(lambda x=x, w=ws: [ext.mkl_linear(x, v) for v in w], 10) / len(ws),
                 "brgemm_max_abs_diff": diff, "mkl_max_abs_diff": mdiff}
            rows.append(r)
            print(f"{m:>3} {str([k, n]):>12} | {r['onednn_warm_us']:8.1f} / {r['onednn_cold_us']:8.1f}   | "
                  f"{r['brgemm_warm_us']:8.1f} / {r['brgemm_cold_us']:8.1f}   | "
                  f"{r['mkl_warm_us']:8.1f} / {r['mkl_cold_us']:8.1f} | {max(diff, mdiff):.1e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"block": args.block, "threads": args.threads, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
