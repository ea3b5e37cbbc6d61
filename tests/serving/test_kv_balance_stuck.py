"""A replica that reports ``stuck`` (its engine wedged: every run refused with UNAVAILABLE) is ranked after
every other, whatever its free KV; a report without the field is read as before."""

from __future__ import annotations

from gambit.serving.kv_balance import ReplicaLoad, rank

STATS = dict(num_blocks=1000, reserved_blocks=0, runs=0, block_size=16, max_model_len=2048,
             max_num_seqs=64, batch_slots=0)


def test_a_stuck_replica_is_ranked_last_though_its_kv_is_free():
    """Old code: ranked by KV alone, the wedged (empty) replica came first and every run paid its refusal."""
    loads = [ReplicaLoad.from_stats("wedged", STATS | {"stuck": True}),
             ReplicaLoad.from_stats("busy", STATS | {"reserved_blocks": 900, "runs": 7}),
             ReplicaLoad.from_stats("half", STATS | {"reserved_blocks": 500, "runs": 3})]
    assert loads[0].stuck and not loads[1].stuck
    need = {x.replica: 200 for x in loads}  # "busy" cannot hold it: it still comes before the wedged one
    assert rank(loads, need, unknown=["new"], capacity=4) == [["half"], ["new"], ["busy"], ["wedged"]]
    assert rank(loads, need, avoid=("half", "busy")) == [["wedged"]]
    assert rank(loads, need, avoid=("half", "busy", "wedged")) == [["busy"], ["half"], ["wedged"]]


def test_stuck_is_read_only_when_reported_true():
    assert not ReplicaLoad.from_stats("a", STATS).stuck  # a replica before stop 69
    assert not ReplicaLoad.from_stats("a", STATS | {"stuck": "yes"}).stuck
