"""Store writes encode nodes from cached JSON fragments: the text must decode to the node's record."""

from __future__ import annotations

import json

from gambit.search.node_json import ListJSON, NodeJSON
from gambit.search.store import EncodedNode, RunUpdate, encode_nodes
from gambit.search.tree import GHOST, Node


def test_list_json_extends_by_the_tail_and_equals_a_full_encoding():
    xs: list = []
    lj = ListJSON()
    assert lj.of(xs) == "[]"
    for chunk in ([5], [6, 7], [], [0.25, 1e-9, 3]):
        xs.extend(chunk)
        assert lj.of(xs) == json.dumps(xs)
    xs[:] = [1]  # shrunk (never in a run): encoded afresh
    assert lj.of(xs) == "[1]"


def test_node_json_decodes_to_to_dict_as_the_node_grows_and_forks():
    node = Node(0, None, 0, 0, 0.8)
    cache = NodeJSON()
    assert json.loads(cache.encode(node)) == node.to_dict()
    node.tokens += [11, 12, 13]
    node.scores.append(0.625)
    assert json.loads(cache.encode(node)) == node.to_dict()
    node.tokens += [14]  # after the last write: the child copies the cache as it was
    child = Node(1, 0, 7, node.depth, 0.8, tokens=list(node.tokens), scores=list(node.scores))
    child_cache = cache.fork()
    child.tokens.append(99)
    child.scores.append(0.125)
    node.state, node.answer = GHOST, "42"
    assert json.loads(child_cache.encode(child)) == child.to_dict()
    assert json.loads(cache.encode(node)) == node.to_dict()


def test_encode_nodes_takes_dicts_and_encoded_text_alike():
    node = Node(3, 1, 2, 0, 1.0, tokens=[1, 2], scores=[0.5])
    got = encode_nodes([{"id": 0, "v": 1}, EncodedNode(3, NodeJSON().encode(node))])
    assert {k: json.loads(v) for k, v in got.items()} == {"0": {"id": 0, "v": 1}, "3": node.to_dict()}
    assert RunUpdate(nodes=[EncodedNode(3, "{}")]).nodes[0].id == 3


def test_scalar_writes_what_json_dumps_writes():
    from gambit.search.node_json import items, scalar

    values = [None, 0, -3, 2**70, 0.1, 1e-9, 1e300, -0.0, float("nan"), float("inf"), "", "running",
              'a"b\\é\n', True, False, [1, 2], {"a": 1}]
    for v in values:
        assert scalar(v) == json.dumps(v), v
    for xs in ([1], [1, 2, 3], [0.5, 2], [True, 1], [1, None], [0.25, 1e-9, -0.0, 1e300, 0.1 + 0.2],
               [0.5, float("nan")], [float("-inf")]):
        assert f"[{items(xs)}]" == json.dumps(xs), xs


def test_node_json_rewrites_the_changed_scalars_only_when_they_change():
    node = Node(2, 0, 5, 3, 0.8, tokens=[1, 2, 3], scores=[0.5])
    cache = NodeJSON()
    first = cache.encode(node)
    assert cache.encode(node) == first
    node.state, node.end_reason, node.end_step, node.answer = "finished", "eos", 9, "7"
    assert json.loads(cache.encode(node)) == node.to_dict()


def test_snapshot_pins_the_node_as_written_while_it_grows_and_changes():
    """``NodeSnapshot`` (what the driver writes to an in-process store) encodes when read, after the
    node moved on; its text must be what encoding at the write gave."""
    from gambit.search.node_json import NodeSnapshot

    node = Node(2, 0, 5, 3, 0.8, tokens=[1, 2, 3, 4], scores=[0.5, 0.25])
    want = NodeJSON().encode(node)
    snap = NodeSnapshot(node)
    node.tokens += [5, 6]
    node.scores.append(0.75)
    node.state, node.answer, node.end_step, node.engine_id = GHOST, "7", 9, None
    assert snap.text == want
    assert json.loads(snap.text) == {**node.to_dict(), "tokens": [1, 2, 3, 4], "scores": [0.5, 0.25],
                                     "state": "running", "answer": None, "end_step": None,
                                     "engine_id": node.engine_id}
    assert json.loads(encode_nodes([snap])["2"]) == json.loads(want)  # Redis encodes it at the write
