"""Per-vendor reference histories: which one a rerun is held to, and that the shipped records are of
the cards' own trainings (the same start, the same steps), made on another vendor."""

from __future__ import annotations

import json

import pytest

from gambit.paths import ASSETS
from gambit.train import vendor_history as vh

CARD = [{"step": 0, "loss": 4.5}, {"step": 1, "loss": 4.25}]


def test_reference_is_the_card_on_its_vendor_and_a_record_elsewhere(tmp_path, monkeypatch):
    assert vh.reference(tmp_path, CARD, "AuthenticAMD", "AuthenticAMD") == (CARD, "the card (AuthenticAMD)")
    missing, why = vh.reference(tmp_path, CARD, "AuthenticAMD", "GenuineIntel")
    assert missing is None and "repro-GenuineIntel.json" in why and "record_vendor_history" in why
    monkeypatch.setattr(vh, "cpu_vendor", lambda: "GenuineIntel")
    other = [{"step": 0, "loss": 4.5, "elapsed_s": 0.3}, {"step": 1, "loss": 4.26}]
    path = vh.write_record(tmp_path, other, "rerun", "AuthenticAMD")
    rec = json.loads(path.read_text())
    assert path.name == "repro-GenuineIntel.json" and rec["card_vendor"] == "AuthenticAMD"
    assert rec["loss_history"] == [{"step": 0, "loss": 4.5}, {"step": 1, "loss": 4.26}]  # timings dropped
    assert vh.reference(tmp_path, CARD, "AuthenticAMD")[0] == rec["loss_history"]  # this CPU: Intel
    with pytest.raises(ValueError, match="reference here"):
        vh.write_record(tmp_path, other, "rerun", "GenuineIntel")


def shipped_records() -> list:
    return sorted(p for p in ASSETS.rglob("repro-*.json"))


@pytest.mark.parametrize("path", shipped_records(), ids=lambda p: str(p.relative_to(ASSETS)))
def test_shipped_record_is_its_cards_training_on_another_vendor(path):
    rec, info = json.loads(path.read_text()), vh.card(path.parent)
    assert rec["card_vendor"] == vh.card_vendor(info) != rec["cpu_vendor"]
    assert rec["torch_version"] == (info.get("torch_version") or info["environment"]["torch"])
    got = rec["loss_history"]
    if "repro" in info:  # a scorer's probe: the same epochs and optimizer steps
        want = info["repro"]["loss_history"]
        assert [(h["epoch"], h["steps"]) for h in got] == [(h["epoch"], h["steps"]) for h in want]
    elif path.parent.name == "target":  # steps 0 and 100 agree across vendors; 200 is the record's
        assert [h["step"] for h in got] == [0, 100, 200]
        assert got[:2] == [{"step": h["step"], "loss": h["loss"]} for h in info["loss_history"][:2]]
    else:  # a drafter: 200 steps, starting where the card starts
        assert [h["step"] for h in got] == list(range(200))
        assert got[0]["loss"] == info["loss_history"][0]["loss"]


def test_kernel_fingerprint_tool_runs_pinned_and_compares(tmp_path):
    """``tools/kernel_fingerprint.py``: the hashes come from a child under the compatible switches, are
    the same on a rerun here, and ``--compare`` names what differs (an edited hash)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    tool, env = repo / "tools" / "kernel_fingerprint.py", {**os.environ, "PYTHONPATH": str(repo / "services")}
    out = tmp_path / "f.json"
    r = subprocess.run([sys.executable, str(tool), "--json", str(out)], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["environment"]["cpu_capability"] == "DEFAULT" and len(res["hashes"]) >= 30
    res["hashes"]["vector exp"] = "0" * 12
    out.write_text(json.dumps(res))
    r = subprocess.run([sys.executable, str(tool), "--compare", str(out)], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0 and f"1 of {len(res['hashes'])} differ" in r.stdout
    assert [ln.split()[:2] for ln in r.stdout.splitlines() if ln.endswith("DIFFERS")] == [["vector", "exp"]]
