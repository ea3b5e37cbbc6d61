"""The lease sweep reads every replica's beat through the views' public ``beats()``: it reached into
their private members (``tree.r``, ``tree._k``, ``tree._call``, ``tree._lock``, ``tree._alive``)."""

import time

from gambit.deployments.run_records import sweep_lost
from gambit.serving.tree_view import MemoryTreeView


class _Public:
    """A tree view seen through its public names only."""

    def __init__(self, view) -> None:
        self._view = view

    def __getattr__(self, name: str):
        if name.startswith("_") or name == "r":
            raise AttributeError(name)
        return getattr(self._view, name)


def test_a_sweep_needs_only_the_views_public_methods():
    view = MemoryTreeView()
    view.lease_s = 0.1
    view.put_run("a", status="running", replica="dead")
    view.beat("dead")
    time.sleep(0.15)
    tree = _Public(view)
    assert sweep_lost(tree, {}) == ["a"] and view.get_run("a")["status"] == "failed"
