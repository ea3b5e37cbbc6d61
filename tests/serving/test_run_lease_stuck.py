"""A Target whose engine loop is stuck in one piece of work stops beating (``run_lease.Progress``)."""

import threading

from serving_util import until


def test_a_target_stops_beating_while_its_engine_is_stuck_and_beats_again_after(monkeypatch):
    """The beat came from its own thread while the engine thread lived: a step that hung (a kernel, a
    deadlock) kept the wedged replica's runs held for ever, and no other replica took them over."""
    import torch

    from gambit.serving import target_heartbeat
    from gambit.serving.embedded import EmbeddedConfig, build_target

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setattr(target_heartbeat, "HEARTBEAT_S", 0.05)
    svc = build_target(EmbeddedConfig(num_blocks=120), None, replica="r-stuck")
    release = threading.Event()
    try:
        svc.tree.lease_s = 0.4
        svc.progress.stuck_s = 0.2
        held = {"status": "running", "replica": "r-stuck"}
        assert until(lambda: "r-stuck" in svc.tree._alive)
        hung = svc.call(lambda: release.wait(10))  # work on the engine thread that does not end
        assert until(lambda: svc.tree.stale_beat(held) is not None)  # old code: it beat on for ever
        assert svc._thread.is_alive() and not hung.done()
        release.set()
        assert hung.result(timeout=5)
        assert until(lambda: svc.tree.stale_beat(held) is None)  # moving again: beating again
    finally:
        release.set()
        monkeypatch.undo()
        svc.close()
        torch.set_num_threads(threads)
