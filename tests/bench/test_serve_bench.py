"""``gambit bench serve``: its load shape (n clients in a closed loop, each sending its share in turn), its
flags checked before the wirings load, and its Redis keys (a store and prefix of its own, emptied)."""

from __future__ import annotations

import os
import re
import threading
import time

import pytest

from gambit.bench import serve_store
from gambit.bench.serve import BenchServeConfig, _threads


def test_clients_keep_n_runs_in_flight_and_send_every_run_once():
    lock, live, peak, seen = threading.Lock(), [0], [0], []

    def run(i: int) -> None:
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
            seen.append(i)
        time.sleep(0.01)
        with lock:
            live[0] -= 1

    _threads(run, 12, clients=4)
    assert sorted(seen) == list(range(12)) and peak[0] == 4
    seen.clear()
    _threads(run, 3)  # default: one burst, every run at once
    assert sorted(seen) == [0, 1, 2]


def test_waves_must_be_positive():
    with pytest.raises(ValueError, match="waves"):
        BenchServeConfig(waves=0)


def test_one_run_pairs_must_be_positive():
    with pytest.raises(ValueError, match="one_run_pairs"):
        BenchServeConfig(one_run_pairs=0)


@pytest.mark.parametrize("levels", ["a", "1,x", "0", ""])
def test_concurrency_must_be_positive_integers(levels):
    with pytest.raises(ValueError, match=f"concurrency: comma-separated integers >= 1, got {levels!r}"):
        BenchServeConfig(concurrency=levels)


@pytest.mark.parametrize("levels", ["2,4", "16,1", "1,4,4", "1,16,4"])
def test_concurrency_levels_increase_from_one_run(levels):
    """"2,4" printed its 2-run figures as the "1 run" wall ratio (and the JSON's wall_ratio with them)."""
    want = r"concurrency: increasing levels starting at 1 .*got " + repr(levels)
    with pytest.raises(ValueError, match=want):
        BenchServeConfig(concurrency=levels)
    assert BenchServeConfig(concurrency="1,2").levels == [1, 2]


@pytest.mark.parametrize(("kw", "message"), [
    ({"grpc_port": 0}, "--grpc-port must be a TCP port (1-65535), got 0"),
    ({"grpc_port": 70000}, "--grpc-port must be a TCP port (1-65535), got 70000"),
    ({"grpc_port": 65534}, "the HTTP port (--grpc-port + 2) must be a TCP port (1-65535), got 65536"),
    ({"metrics_port": 9310}, "--metrics-port and --grpc-port are both 9310; they must differ"),
    ({"model": "/nonexistent"}, "--model /nonexistent: no model folder there"),
    ({"scorer": "nope"}, "--scorer: scorer 'nope': no scorer folder there"),
    ({"store": "memory"}, "--store must be a redis:// or rediss:// URL"),
])
def test_the_wiring_flags_are_checked_before_it_loads(kw, message):
    """Found after ~a minute of loading the embedded wiring, or not before a 90 s timeout."""
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        BenchServeConfig(**kw)


def test_a_bad_flag_is_one_line_naming_it_and_exit_2(capsys):
    """"reps must be >= 1" with exit 1, where the other benches say "--reps must be >= 1" and exit 2."""
    from gambit.bench import serve

    with pytest.raises(SystemExit) as e:
        serve.main(["--quick", "--reps", "0"])
    assert e.value.code == 2
    assert capsys.readouterr().err == "gambit bench serve: error: --reps must be >= 1, got 0\n"
    with pytest.raises(SystemExit) as e:
        serve.main(["--one-run-pairs", "0"])
    assert e.value.code == 2 and "error: --one-run-pairs must be >= 1, got 0" in capsys.readouterr().err


def test_the_distributed_wiring_uses_the_store_and_prefix_given():
    """The store was hard-coded: redis://127.0.0.1:6379/0 under "bench-serve:" for every run."""
    from gambit.bench.serve import serve_config

    scfg = serve_config(BenchServeConfig(store="redis://127.0.0.1:6379/7"), "mine:")
    assert (scfg.tree, scfg.prefix) == ("redis://127.0.0.1:6379/7", "mine:")
    assert serve_store.fresh_prefix() != serve_store.fresh_prefix()  # two runs of one second never share


def test_the_store_is_shown_as_every_other_message_shows_a_redis_url():
    """Its own regex dropped an ACL user name and printed a ?password= query as given."""
    assert serve_store.shown("redis://alice:pw@h:6379/0") == "redis://alice@h:6379/0"
    assert serve_store.shown("redis://:pw@h:6379/0") == "redis://h:6379/0"
    assert serve_store.shown("redis://h:6379/0?password=pw&db=1") == "redis://h:6379/0?db=1"
    assert serve_store.shown("redis://h:6379/0") == "redis://h:6379/0"


@pytest.fixture
def redis_url():
    url = "redis://127.0.0.1:6379/0"
    try:
        serve_store.check_store(url, "gambit-test-bench-serve-probe:", explicit=False)
    except OSError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    return url


def test_the_bench_deletes_its_keys_at_the_end_even_when_it_fails(redis_url, monkeypatch):
    """21 keys with a day's TTL were left in the shared db 0 after a run."""
    import redis

    from gambit.bench import serve
    from gambit.deployments import local

    r = redis.Redis.from_url(redis_url, decode_responses=True)
    base = f"gambit-test-bench-serve-{os.getpid()}"
    prefix, other = f"{base}:a*[x]:", f"{base}:ab:"  # glob characters in the prefix match only themselves
    seen = {}

    def measure(cfg, scfg):
        seen["prefix"] = scfg.prefix
        for i in range(3):
            r.set(f"{scfg.prefix}run:{i}", "x", ex=600)
        raise RuntimeError("the run failed")

    monkeypatch.setattr(serve, "measure", measure)
    monkeypatch.setattr(local, "check_startable", lambda scfg: None)
    try:
        r.set(other + "run:1", "theirs")
        with pytest.raises(RuntimeError, match="the run failed"):
            serve.bench(BenchServeConfig(store=redis_url, prefix=prefix))
        assert seen["prefix"] == prefix and not list(r.scan_iter(match=f"{base}:a\\*\\[x\\]:*"))
        assert r.get(other + "run:1") == "theirs"
        with pytest.raises(RuntimeError):  # the default: a fresh prefix of the run's own, emptied too
            serve.bench(BenchServeConfig(store=redis_url))
        assert seen["prefix"].startswith("bench-serve:") and not list(r.scan_iter(match=seen["prefix"] + "*"))
        with pytest.raises(ValueError, match=f"^--prefix {re.escape(other)}: .* already holds keys"):
            serve.bench(BenchServeConfig(store=redis_url, prefix=other))  # someone's keys: not emptied
        assert r.get(other + "run:1") == "theirs"
    finally:
        r.delete(other + "run:1")
        serve_store.delete_prefix(redis_url, f"{base}:")


def test_an_unreachable_store_is_refused_before_the_wiring_loads():
    from gambit.bench import serve

    with pytest.raises(OSError, match="^--store redis://127.0.0.1:1/0: no Redis answers there"):
        serve.bench(BenchServeConfig(store="redis://127.0.0.1:1/0"))
