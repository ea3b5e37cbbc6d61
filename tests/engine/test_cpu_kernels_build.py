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


def test_first_build_is_announced(tmp_path, monkeypatch, capsys):
    """A first compile takes ~40 s: it is announced on stderr, a cached build is not."""
    import torch.utils.cpp_extension as ext

    monkeypatch.setattr(ext, "_get_build_directory", lambda name, verbose: str(tmp_path / name))
    cpu_attention._announce_build("k1")
    err = capsys.readouterr().err
    assert "compiling the CPU kernels once" in err and str(tmp_path / "k1") in err
    (tmp_path / "k2").mkdir()
    (tmp_path / "k2" / "k2.so").write_bytes(b"")
    cpu_attention._announce_build("k2")
    assert capsys.readouterr().err == ""
