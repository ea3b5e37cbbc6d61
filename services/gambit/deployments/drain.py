"""``gambit serve``'s stop: the runs in flight end with a Result before Serve goes.

SIGINT / SIGTERM shut Serve down at once: its proxy went first, so every client in a Solve stream got
``UNAVAILABLE: Stream removed`` and no Result, and each run ended in Redis as "client disconnected or
coordinator lost", which a backend cannot tell from a network blip. Now each run that a Target replica
of this server holds is stopped through its cancel flag (the Targets poll them) with ``SHUTTING_DOWN``:
its Result (status ``cancelled``, that message) reaches the client through its Coordinator as any
cancelled run's does, and Serve shuts down after.
"""

from __future__ import annotations

import time

from gambit.serving.tree_view import ENDED, StoreUnavailable

SHUTTING_DOWN = "server shutting down; retry with a new run_id"
RELAY_S = 0.5  # after the records end: the Results' way through the Coordinators to the clients


def target_replicas(app: str = "gambit") -> set[str]:
    """This Ray cluster's Target replica ids (Serve names each replica actor ``SERVE_REPLICA::app#
    deployment#id``; read from the GCS, no dashboard needed)."""
    import ray

    head = f"SERVE_REPLICA::{app}#Target#"
    return {a["name"][len(head):] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(head)}


def drain(tree, replicas: set[str], wait_s: float = 10.0) -> list[str]:
    """Stop the runs ``tree`` says run on ``replicas`` and wait up to ``wait_s`` for their records to
    end; returns their ids. Runs of another server sharing the Redis prefix are left alone. Once the
    flags are set, a Redis blip while waiting is waited through: it ended the drain, so Serve went down
    at once and the Results on their way to the clients with it."""
    runs = tree.running_on(replicas) if replicas else []
    stopping = tree.cancel_requested(runs) if runs else {}
    for run_id in runs:  # one being stopped already (CancelRun, a drain before) keeps its reason: a
        if run_id not in stopping:  # run its client cancelled is not one to "retry with a new run_id"
            tree.request_cancel(run_id, SHUTTING_DOWN)
    deadline = time.monotonic() + wait_s
    left = list(runs)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [r for r in left if not _ended(tree, r)]
    if runs:
        time.sleep(RELAY_S)
    return runs


def _ended(tree, run_id: str) -> bool:
    """The run's record says it ended (False when Redis does not answer: asked again)."""
    try:
        return (tree.get_run(run_id) or {}).get("status") in ENDED
    except StoreUnavailable:
        return False
