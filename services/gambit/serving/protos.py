"""Generated gRPC code for ``protos/gambit/v1/*.proto``, built on first import (grpcio-tools).

The generated modules are not committed: they go to ``services/gambit/protos_gen/`` (git-ignored)
and are rebuilt whenever a ``.proto`` file is newer. Generation writes to a temporary folder and
renames it into place, so concurrent first imports (Ray workers) never see half a package.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]
OUT = PACKAGE_DIR / "protos_gen"
PROTO_ROOT = Path(os.environ.get("GAMBIT_PROTOS", PACKAGE_DIR.parents[1] / "protos"))
PROTO_DIR = PROTO_ROOT / "gambit" / "v1"
NAMES = ("reasoning", "scorer")


def _stale() -> bool:
    stamp = OUT / "__init__.py"
    if not stamp.exists():
        return True
    if not PROTO_DIR.exists():  # installed without the sources: use what was generated
        return False
    built = stamp.stat().st_mtime
    return any((PROTO_DIR / f"{n}.proto").stat().st_mtime > built for n in NAMES)


def generate() -> Path:
    """(Re)generate the modules into ``protos_gen/``; returns that folder."""
    from grpc_tools import protoc

    missing = [n for n in NAMES if not (PROTO_DIR / f"{n}.proto").exists()]
    if missing:
        raise FileNotFoundError(f"proto sources {missing} not found under {PROTO_DIR}")
    tmp = Path(tempfile.mkdtemp(prefix=".protos_gen-", dir=PACKAGE_DIR))
    try:
        include = str(Path(protoc.__file__).parent / "_proto")
        for n in NAMES:
            rc = protoc.main(["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={tmp}",
                              f"--pyi_out={tmp}", f"--grpc_python_out={tmp}", str(PROTO_DIR / f"{n}.proto")])
            if rc != 0:
                raise RuntimeError(f"protoc failed on {n}.proto (exit {rc})")
            pb2_file = tmp / f"{n}_pb2.py"  # classes must name their real module (pickling inside Ray)
            pb2_file.write_text(pb2_file.read_text().replace(f"'{n}_pb2'", f"'gambit.protos_gen.{n}_pb2'"))
            grpc_file = tmp / f"{n}_pb2_grpc.py"  # make the generated import package-relative
            grpc_file.write_text(re.sub(rf"^import {n}_pb2 as", f"from . import {n}_pb2 as",
                                        grpc_file.read_text(), flags=re.M))
        (tmp / "__init__.py").write_text('"""Generated from protos/gambit/v1 by gambit.serving.protos."""\n')
        old = OUT.with_name(f".protos_gen-old-{os.getpid()}")
        if OUT.exists():
            OUT.rename(old)
        try:
            tmp.rename(OUT)
        except OSError:  # another process won the race: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    importlib.invalidate_caches()
    return OUT


def load(name: str):
    """``(pb2, pb2_grpc)`` for ``name`` in {"reasoning", "scorer"}, generating first if needed."""
    if name not in NAMES:
        raise ValueError(f"unknown proto {name!r}; known: {NAMES}")
    if _stale():
        generate()
    pb2 = importlib.import_module(f"gambit.protos_gen.{name}_pb2")
    grpc_mod = importlib.import_module(f"gambit.protos_gen.{name}_pb2_grpc")
    return pb2, grpc_mod
