"""Writing the target's tap rows into the speculative decoder's tap buffer, one C++ call a step.

Every step with speculative traces that decode plainly (prefill chunks, steps above ``spec.max_batch``)
keeps their drafter's context current by writing each fed row's target taps, side by side, into the
tap buffer at the row's KV slot (``SpecDecoder.store``). Through ATen that was a ``cat`` of the taps
and an ``index_copy_`` into the buffer. Here the rows go straight from the taps to their slots (the same
bytes) with no intermediate tensor and no parallel region, stored non-temporally (the buffer's rows are
cold and read again only when the trace next drafts). ``tools/spec_cap_cost.py N`` on a 2-core Intel Xeon:
time inside ``store`` per capped step 46 → 27 µs at 8 traces, 200 → 148 µs at 96.
"""

from __future__ import annotations

import torch

from gambit.engine import cpu_attention

SOURCE = r"""
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
// n bytes from src to dst with non-temporal stores where both allow it (dst 16-byte aligned, n a multiple
// of 16): the tap buffer's rows are cold and read again only when the trace next drafts.
static void stream_copy(char* dst, const char* src, int64_t n) {
#if defined(__SSE2__)
  if (reinterpret_cast<uintptr_t>(dst) % 16 == 0 && n % 16 == 0) {
    for (int64_t i = 0; i < n; i += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

// dst[slots[r]] = [srcs[0][r], srcs[1][r], ...] for each r in rows (rows empty: every row 0..M-1).
// dst [S, W] and every srcs[j] [M, w_j] contiguous CPU tensors of one dtype, sum of w_j = W; slots [M].
void rows_to_slots(at::Tensor dst, at::Tensor slots, at::Tensor rows, std::vector<at::Tensor> srcs) {
  TORCH_CHECK(dst.device().is_cpu() && dst.is_contiguous() && dst.dim() == 2,
              "rows_to_slots: dst must be a contiguous CPU [S, W] tensor");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.dim() == 1 &&
                  rows.scalar_type() == at::kLong && rows.is_contiguous() && rows.dim() == 1,
              "rows_to_slots: slots and rows must be contiguous 1-D int64 tensors");
  const int64_t S = dst.size(0), W = dst.size(1), M = slots.size(0), es = dst.element_size();
  std::vector<const char*> src;
  std::vector<int64_t> bytes;
  int64_t width = 0;
  for (const auto& s : srcs) {
    TORCH_CHECK(s.device().is_cpu() && s.is_contiguous() && s.dim() == 2 && s.size(0) == M &&
                    s.scalar_type() == dst.scalar_type(),
                "rows_to_slots: each source must be a contiguous CPU [M, w] tensor of dst's dtype, M = ", M);
    src.push_back(static_cast<const char*>(s.data_ptr()));
    bytes.push_back(s.size(1) * es);
    width += s.size(1);
  }
  TORCH_CHECK(width == W, "rows_to_slots: the sources are ", width, " wide, dst rows ", W);
  const int64_t N = rows.numel() ? rows.size(0) : M;
  const int64_t* sl = slots.data_ptr<int64_t>();
  const int64_t* rw = rows.numel() ? rows.data_ptr<int64_t>() : nullptr;
  char* d = static_cast<char*>(dst.data_ptr());
  for (int64_t n = 0; n < N; ++n) {
    const int64_t r = rw ? rw[n] : n;
    TORCH_CHECK(r >= 0 && r < M, "rows_to_slots: row ", r, " not in [0, ", M, ")");
    TORCH_CHECK(sl[r] >= 0 && sl[r] < S, "rows_to_slots: slot ", sl[r], " not in [0, ", S, ")");
    char* out = d + sl[r] * W * es;
    for (size_t j = 0; j < src.size(); ++j) {
      stream_copy(out, src[j] + r * bytes[j], bytes[j]);
      out += bytes[j];
    }
  }
#if defined(__SSE2__)
  _mm_sfence();
#endif
}
"""

_ALL = torch.empty(0, dtype=torch.long)  # "every row" (pybind takes no None)


def write_rows(buf: torch.Tensor, slots: torch.Tensor, rows: list[int] | None, taps: list[torch.Tensor]
               ) -> None:
    """``buf[slots[r]] = cat(taps[j][r] for j)`` for each r in ``rows`` (None: every row, in order).

    ``taps``: [M, H] tensors (the forward's rows), ``slots`` [M]: each row's KV slot."""
    if rows is not None and not rows:
        return
    kernel = cpu_attention.kernel() if buf.device.type == "cpu" else None
    if kernel is not None and buf.is_contiguous():
        idx = _ALL if rows is None else torch.tensor(rows, dtype=torch.long)
        kernel.rows_to_slots(buf, slots.contiguous(), idx, [t.contiguous() for t in taps])
        return
    if rows is None:  # every row, in order: no gather
        buf.index_copy_(0, slots, torch.cat(taps, dim=-1))
        return
    r = torch.tensor(rows, device=buf.device)
    buf.index_copy_(0, slots[r], torch.cat([t[r] for t in taps], dim=-1))
