"""A trace's pending drafter inputs: counted without a scan, joined in batches, widths kept apart."""

from __future__ import annotations

import torch

from gambit.speculative.decoder import FEATS_COMPACT, DraftState


def test_pending_rows_and_joins():
    st = DraftState("pr")
    st.set_feats([torch.randn(5, 8)])  # a verified feature chunk (width H = 8)
    raw = [torch.randn(1, 24) for _ in range(2 * FEATS_COMPACT + 2)]  # plain steps' taps (3H)
    for r in raw:
        st.add(r)
    assert st.pending == 5 + len(raw)
    # every FEATS_COMPACT new chunks became one tensor per width run (the first run counted the
    # verified chunk); the newest three wait
    assert [tuple(f.shape) for f in st.feats] == [(5, 8), (FEATS_COMPACT - 1, 24), (FEATS_COMPACT, 24),
                                                   (1, 24), (1, 24), (1, 24)]
    assert torch.equal(torch.cat(st.feats[1:]), torch.cat(raw))
    child = st.clone()
    assert child.pending == st.pending and child.joined == st.joined and child.feats == st.feats
    st.set_feats([])
    assert st.pending == 0 and st.joined == 0
