"""``gambit bench search``'s configuration: what it refuses, and the variants ``--methods`` keeps."""

from __future__ import annotations

import pytest

from gambit.bench.search import METHODS, BenchSearchConfig, variants


def test_unknown_methods_are_named():
    with pytest.raises(ValueError, match=r"methods: unknown \['bogus'\]; known \['gambit'"):
        BenchSearchConfig(methods="gambit,bogus")


def test_methods_keep_exactly_the_named_variants():
    v = variants(BenchSearchConfig(methods="step,sc", pr=False))
    assert set(v) == {"step", "sc"} and v["step"][1].method == "step" and v["sc"][1].method == "sc"
    assert set(variants(BenchSearchConfig(pr=False))) == set(METHODS) - {"gambit_pr"}


def test_gambit_pr_without_pr_is_refused_not_dropped():
    with pytest.raises(ValueError, match="gambit_pr needs --pr"):
        variants(BenchSearchConfig(methods="gambit,gambit_pr", pr=False))
