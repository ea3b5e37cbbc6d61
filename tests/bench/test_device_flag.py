"""``--device cuda`` / ``cuda:N`` on a host without that GPU: one ValueError naming the flag, before any
model loads (it was a 30-line "Torch not compiled with CUDA enabled" traceback from the model's .to())."""

from __future__ import annotations

import pytest
import torch

from gambit.bench import args as bench_args


def gpus(monkeypatch, n: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


@pytest.mark.parametrize("value", ["cuda", "cuda:0", "cuda:1"])
def test_cuda_without_a_gpu_is_refused(value, monkeypatch):
    gpus(monkeypatch, 0)
    message = rf"^--device {value}: no such CUDA device here \(torch .*, 0 GPUs\)$"
    with pytest.raises(ValueError, match=message):
        bench_args.device("--device", value)


@pytest.mark.parametrize(("value", "ok"), [("cuda", True), ("cuda:0", True), ("cuda:1", True),
                                           ("cuda:2", False), ("cuda:17", False)])
def test_cuda_n_beyond_the_device_count_is_refused(value, ok, monkeypatch):
    gpus(monkeypatch, 2)
    if ok:
        assert bench_args.device("--device", value) == value
    else:
        with pytest.raises(ValueError, match=rf"^--device {value}: no such CUDA device here .*, 2 GPUs\)$"):
            bench_args.device("--device", value)


@pytest.mark.parametrize("value", ["auto", "cpu"])
def test_auto_and_cpu_pass_without_a_gpu(value, monkeypatch):
    gpus(monkeypatch, 0)
    assert bench_args.device("--device", value) == value


def test_bench_spec_refuses_cuda_before_the_bench_starts(monkeypatch):
    import gambit.bench.spec

    gpus(monkeypatch, 0)

    def run_bench(*a, **k):
        raise AssertionError("the bench started before the check")

    monkeypatch.setattr(gambit.bench.spec, "run_bench", run_bench)
    with pytest.raises(ValueError, match="^--device cuda: no such CUDA device here"):
        gambit.bench.spec.main(["--device", "cuda", "--quick"])


def test_bench_search_config_refuses_cuda_n_beyond_the_count(monkeypatch):
    from gambit.bench.search import BenchSearchConfig

    gpus(monkeypatch, 1)
    assert BenchSearchConfig(device="cuda:0").device == "cuda:0"
    with pytest.raises(ValueError, match=r"^device cuda:1: no such CUDA device here .*, 1 GPU\)$"):
        BenchSearchConfig(device="cuda:1")


def test_the_cli_prints_one_error_line(monkeypatch, capsys):
    from gambit.cli import main

    gpus(monkeypatch, 0)
    rc = main(["bench", "spec", "--device", "cuda:0", "--quick"])
    err = capsys.readouterr().err
    assert rc != 0
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("gambit bench spec: error: --device cuda:0: no such CUDA")
