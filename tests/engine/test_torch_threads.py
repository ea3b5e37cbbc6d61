"""The helpers of ``gambit.engine.torch_threads`` (their effect: tests/serving/test_openmp_pool.py)."""

import sys
import threading

import pytest

from gambit.engine.torch_threads import on_fresh_thread, voluntary_switches


def test_on_fresh_thread_returns_and_raises_on_another_thread():
    seen = []
    assert on_fresh_thread(lambda: seen.append(threading.get_ident()) or 7) == 7
    assert seen and seen[0] != threading.get_ident()
    with pytest.raises(KeyError, match="boom"):
        on_fresh_thread(lambda: {}["boom"])


def test_voluntary_switches_reads_this_thread():
    n = voluntary_switches(threading.get_native_id())
    assert n >= 0 if sys.platform.startswith("linux") else n == -1
