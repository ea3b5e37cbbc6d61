"""The shipped target against its command: its first 200 steps, retrained under the card's
``--isa compatible``, give the card's loss history exactly on AMD and the Intel record on Intel
(README, "Reproducible models": the first shipped target, trained with the machine's kernels,
reproduced to step 100 only)."""

from __future__ import annotations

import json

import pytest
import torch

from gambit.paths import TARGET
from gambit.train import vendor_history
from gambit.train.repro import compare_history
from gambit.train.target import TrainTargetConfig, train_target


def card_config(tmp_path) -> tuple[dict, TrainTargetConfig]:
    return vendor_history.card(TARGET), vendor_history.target_config(str(tmp_path / "target"))


def test_card_records_environment():
    card = json.loads((TARGET / "training.json").read_text())
    assert card["torch_threads"] >= 1 and card["torch_version"].startswith("2.")
    assert f"{card['torch_threads']} CPU threads" in (TARGET / "README.md").read_text()


def test_history_comparison_catches_a_difference():
    a = [{"step": 0, "loss": 1.0}, {"step": 100, "loss": 0.5}]
    assert compare_history(a, a, 100) == []
    assert compare_history(a, [{"step": 0, "loss": 1.0}, {"step": 100, "loss": 0.50001}], 100)
    assert compare_history(a, a[:1], 100)  # a missing step is a mismatch
    with pytest.raises(ValueError, match="threads"):
        TrainTargetConfig(threads=0)



@pytest.mark.parametrize("field, value", [
    ("weight_decay", float("nan")), ("weight_decay", -0.1), ("weight_decay", float("inf")),
    ("lr", float("inf")), ("min_lr_ratio", 2.0), ("min_lr_ratio", -0.1), ("min_lr_ratio", float("nan")),
    ("warmup", -1), ("checkpoint_every", -1), ("hidden_size", 0), ("num_heads", 0), ("num_kv_heads", 0),
    ("intermediate_size", 0), ("max_positions", 0), ("min_ops", 0), ("max_ops", 1)])
def test_bad_training_values_are_refused_up_front(field, value):
    """Refused when the config is built (before any model or data), naming the field and the value."""
    with pytest.raises(ValueError, match=rf"{field}.*{value!r}" if field != "max_ops" else "max_ops"):
        TrainTargetConfig(**{field: value})
    TrainTargetConfig()  # the defaults (the shipped card's) still construct
    TrainTargetConfig(warmup=0, checkpoint_every=0, weight_decay=0.0, min_lr_ratio=1.0)  # the edges

def test_float64_training_saves_float32_weights_and_records_its_arithmetic(tmp_path):
    from safetensors import safe_open

    with pytest.raises(ValueError, match="train_dtype"):
        TrainTargetConfig(train_dtype="bfloat16")
    info = train_target(TrainTargetConfig(out=str(tmp_path / "t64"), steps=2, warmup=1, threads=1,
                                          train_dtype="float64"))
    assert info["config"]["train_dtype"] == "float64"
    with safe_open(str(tmp_path / "t64" / "model.safetensors"), "pt") as f:
        dtypes = {f.get_tensor(k).dtype for k in f.keys()}
    assert dtypes == {torch.float32}
    # float64 arithmetic is not float32's: the first loss differs in its 5 digits (init drawn in float64)
    f32 = train_target(TrainTargetConfig(threads=1), stop=1)["loss_history"][0]["loss"]
    assert info["loss_history"][0]["loss"] != f32


def test_repro_tool_pins_the_instruction_set(tmp_path):
    """``tools/target_repro_dtype.py --isa``: each child runs under the libraries' ISA switches, and the
    JSON says which and on what machine (stop 38 found step 200 moves with the instruction set)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    tool, env = repo / "tools" / "target_repro_dtype.py", {**os.environ, "PYTHONPATH": str(repo / "services")}
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(tool), "--steps", "1", "--threads", "1", "--dtypes", "float32",
                        "--isa", "compatible", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["isa"] == "compatible" and res["runs"]["float32/1"] == [[0, 4.54276]]  # the card's step 0
    assert res["machine"]["torch"] == torch.__version__ and "torch_cpu_capability" in res["machine"]
    bad = subprocess.run([sys.executable, str(tool), "--isa", "avx512"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert bad.returncode == 2 and "--isa" in bad.stderr


def test_an_instruction_set_is_pinned_in_a_child_process(tmp_path):
    """``isa="compatible"`` cannot take effect in a process whose torch already loaded: the run goes to
    a child under the switches, which reports ATen's scalar kernels and the card's first step."""
    from gambit.train import repro

    with pytest.raises(ValueError, match="isa must be one of machine, compatible"):
        TrainTargetConfig(isa="avx512")
    assert repro.isa_pinned("machine")
    assert not repro.isa_pinned("compatible")  # pytest's own process runs the machine's kernels
    r = train_target(TrainTargetConfig(isa="compatible", out=str(tmp_path / "t")), stop=1)
    assert r["cpu_capability"] == "DEFAULT" and r["config"]["isa"] == "compatible"
    assert r["loss_history"] == [{"step": 0, "loss": 4.54276, "elapsed_s": r["loss_history"][0]["elapsed_s"]}]
    with pytest.raises(RuntimeError, match="under isa=compatible exited"):
        repro.run_pinned("compatible", "gambit.train.target", "train_target", {"steps": 0})


@pytest.mark.slow
def test_shipped_target_reproduces_200_steps_on_any_cpu(tmp_path):
    """The shipped target (``gambit train target --isa compatible``): its first 200 steps, retrained
    under the same switches in a child process, give its card's loss history exactly on whatever x86
    CPU runs this (its card came from a 2-core AMD EPYC with AVX-512; an AVX2-only one gave the same):
    the card's history on AMD, the Intel record elsewhere (``gambit.train.vendor_history``)."""
    card, cfg = card_config(tmp_path)
    assert cfg.isa == "compatible" and card["cpu_capability"] == "DEFAULT"
    expected, source = vendor_history.reference(TARGET, card["loss_history"], card["cpu_vendor"])
    if expected is None:
        pytest.skip(source)
    fresh = vendor_history.rerun_target(str(tmp_path / "target"))
    assert [h["step"] for h in fresh["loss_history"]] == [0, 100, 200]
    assert compare_history(expected, fresh["loss_history"], upto=200) == [], source
    assert fresh["cpu_capability"] == "DEFAULT" and fresh["torch_threads"] == card["torch_threads"]
