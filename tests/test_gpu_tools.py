"""The GPU tools (tools/gpu_*.py) and the prepared device run (tools/gpu_run.sh), checked on the CPU.

A device call is scarce (15 min a task, machine starts included): the script must fit one call with room
for a rerun, run the never-run CUDA-graph check first with its log in $OUT, and a tool given a bad flag
must refuse it before any model loads instead of crashing after minutes (``--reps 0`` once died in
``statistics.median`` after every check; ``--out /tmp`` after the whole profile)."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"
SCRIPT = TOOLS / "gpu_run.sh"
BUDGET_S = 15 * 60  # a task's device time, every start and call together
START_S, IDLE_S = 120, 60  # a machine start (1-2 min); a wait between calls while a fix is made

if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))  # a script's own folder, as `python tools/x.py` has it


def commands() -> list[str]:
    return [x for x in SCRIPT.read_text().splitlines() if x.strip() and not x.lstrip().startswith("#")]


def test_gpu_run_sh_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)


def test_gpu_run_sh_limits_sum_to_its_header_and_leave_room_for_a_rerun():
    text = SCRIPT.read_text()
    limits = [int(n) for line in commands() for n in re.findall(r"\btimeout (\d+)\b", line)]
    header = re.search(r"sum\s+#?\s*to at most (\d+) s \(([\d +]+) s", text.replace("\n#", ""))
    assert header, "the header states the parts' limits and their sum"
    stated = int(header.group(1))
    assert sum(limits) == stated == sum(int(x) for x in header.group(2).split("+")), limits
    call = int(re.search(r"timeout_s=(\d+)", text).group(1))
    assert stated < call <= 600  # the call outlives its parts; a device command runs at most 10 min
    assert START_S + 2 * call + IDLE_S <= BUDGET_S  # a first call and a rerun on the warm machine
    assert 2 * START_S + 2 * call <= BUDGET_S  # or a rerun on a fresh one


def test_gpu_run_sh_runs_the_graph_check_first_and_keeps_its_log():
    lines = commands()
    tools = [m.group(1) for x in lines for m in [re.search(r"\$PY (tools/\S+\.py|-m \S+)", x)] if m]
    assert tools[0] == "tools/gpu_graphs.py", tools
    graphs = next(x for x in lines if "tools/gpu_graphs.py" in x)
    assert 'tee -a "$OUT/gpu_graphs.log"' in graphs and '--json "$OUT/gpu_graphs.json"' in graphs
    assert not any("target_repro_dtype" in x or "bench search" in x for x in lines)  # stale / measured
    outs = {m for x in lines for m in re.findall(r'"\$OUT/([^"]+)"', x)}
    assert len(outs) <= 8, outs  # what one device call returns


def run_tool(name: str, argv: list[str], monkeypatch) -> SystemExit:
    """Run tools/NAME with ARGV in this process; any model load fails the test (the checks come first)."""
    import gambit.model.loader

    def load_model(*a, **k):
        raise AssertionError("a model loaded before the flags were checked")

    monkeypatch.setattr(gambit.model.loader, "load_model", load_model)
    monkeypatch.setattr(sys, "argv", [f"tools/{name}", *argv])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(TOOLS / name), run_name="__main__")
    return e.value


def gpus(monkeypatch, n: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


BAD = [
    ("gpu_check.py", ["--reps", "0"], "--reps: must be >= 1, got 0"),
    ("gpu_check.py", ["--per", "0"], "--per: must be >= 1, got 0"),
    ("gpu_check.py", ["--max-tokens", "0"], "--max-tokens: must be >= 1, got 0"),
    ("gpu_check.py", ["--quick", "--per", "0"], "--per: must be >= 1, got 0"),
    ("gpu_check.py", ["--device", "cuda"], "--device cuda: no such CUDA device here"),
    ("gpu_check.py", ["--device", "auto"], "--device: name cpu, cuda or cuda:N"),
    ("gpu_graphs.py", ["--reps", "0"], "--reps: must be >= 1, got 0"),
    ("gpu_graphs.py", ["--tokens", "0"], "--tokens: must be >= 1, got 0"),
    ("gpu_graphs.py", ["--batches", "0"], "--batches: want comma-separated ints >= 1, got '0'"),
    ("gpu_graphs.py", ["--batches", "1,x"], "--batches: want comma-separated ints >= 1, got '1,x'"),
    ("gpu_graphs.py", ["--device", "cuda:0"], "--device cuda:0: no such CUDA device here"),
    ("gpu_profile.py", ["--tokens", "0"], "--tokens: must be >= 1, got 0"),
    ("gpu_profile.py", ["--rows", "0"], "--rows: must be >= 1, got 0"),
    ("gpu_profile.py", ["--device", "cuda"], "--device cuda: no such CUDA device here"),
]


@pytest.mark.parametrize(("tool", "argv", "message"), BAD)
def test_a_bad_flag_is_refused_before_any_model_loads(tool, argv, message, monkeypatch, capsys):
    gpus(monkeypatch, 0)
    e = run_tool(tool, ["--device", "cpu", *argv], monkeypatch)
    err = capsys.readouterr().err
    assert e.code == 2 and message in err and "Traceback" not in err, err


def test_cuda_n_beyond_the_device_count_is_refused(monkeypatch, capsys):
    gpus(monkeypatch, 2)
    e = run_tool("gpu_check.py", ["--device", "cuda:2"], monkeypatch)
    assert e.code == 2 and "--device cuda:2: no such CUDA device here" in capsys.readouterr().err


@pytest.mark.parametrize(("tool", "flag"), [("gpu_check.py", "--json"), ("gpu_graphs.py", "--json"),
                                            ("gpu_profile.py", "--out")])
def test_an_output_that_cannot_be_written_is_refused_up_front(tool, flag, tmp_path, monkeypatch, capsys):
    gpus(monkeypatch, 0)
    e = run_tool(tool, ["--device", "cpu", flag, str(tmp_path)], monkeypatch)
    assert e.code == 2 and f"{flag} {tmp_path}: a folder; name a file" in capsys.readouterr().err
    (tmp_path / "f").write_text("")
    e = run_tool(tool, ["--device", "cpu", flag, str(tmp_path / "f" / "x.txt")], monkeypatch)
    assert e.code == 2 and "no folder" in capsys.readouterr().err


def test_quick_sets_only_the_flags_not_given():
    """``--quick --per 2 --max-tokens 200`` once ran 1 prompt a split at 24 tokens, without a word."""
    from gpu_check import parse_args

    a = parse_args(["--device", "cpu", "--quick", "--per", "2", "--max-tokens", "200"])
    assert (a.per, a.max_tokens, a.reps) == (2, 200, 1)
    a = parse_args(["--device", "cpu", "--quick"])
    assert (a.per, a.max_tokens, a.reps) == (1, 24, 1)
    a = parse_args(["--device", "cpu", "--reps", "5"])
    assert (a.per, a.max_tokens, a.reps) == (4, 96, 5)


def test_graph_speedup_is_the_ratio_of_the_medians_it_prints():
    """It printed "eager 129 tok/s, graphs 172 tok/s: 0.90x" (the median of per-repetition ratios)."""
    from gpu_graphs import speed

    te, tg = [1.0, 2.0, 1.1], [0.7, 0.75, 2.4]  # noisy: the per-repetition ratios' median is 1.43
    s = speed(100, te, tg)
    assert s["speedup"] == pytest.approx(s["graphs_tok_s"] / s["eager_tok_s"]) == pytest.approx(1.1 / 0.75)
    assert s["per_rep_ratio_range"] == pytest.approx([1.1 / 2.4, 2.0 / 0.75])
