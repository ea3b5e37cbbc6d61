"""The C++ kernels build wherever a toolchain is: their tests skip without one, so a source that no
longer compiles (say, a compiler crash) would otherwise pass CI unseen on the PyTorch fallback."""

from __future__ import annotations

import os
import shutil

import pytest

from gambit.engine import cpu_attention


@pytest.mark.skipif(os.environ.get("GAMBIT_NO_CPU_KERNEL") is not None, reason="kernels switched off")
def test_kernels_build_where_a_compiler_is():
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler on this machine")
    mod = cpu_attention.kernel()
    assert mod is not None, "the CPU kernels did not build: see gambit.engine.cpu_attention's warning"
    for fn in ("paged_decode", "paged_attention", "dense_attention", "decoder_layers", "tree_draft",
               "sample_step"):
        assert hasattr(mod, fn), fn

