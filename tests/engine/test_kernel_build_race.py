"""Two processes loading the CPU kernels at once: the waiter never takes a module file that the
compiling process is still writing, and never deletes it.

The linker creates ``NAME.so`` before it has written it. The waiter once returned as soon as that file
existed, failed to load it ("file too short"), removed it, and both processes ran the PyTorch path."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from gambit.engine import kernel_build


def _real_module() -> tuple[str, bytes]:
    """A small real extension module (its name, its bytes) to stand for the kernels."""
    speedups = pytest.importorskip("markupsafe._speedups")
    with open(speedups.__file__, "rb") as f:
        return "_speedups", f.read()


def test_a_module_written_since_the_lock_was_taken_is_waited_for(tmp_path, capsys):
    lock, so = tmp_path / "lock", tmp_path / "k.so"
    lock.write_bytes(b"")
    so.write_bytes(b"\x7fELF")  # the linker's first bytes, after the lock was taken
    os.utime(lock, (time.time() - 1, time.time() - 1))

    def finish() -> None:
        so.write_bytes(b"\x7fELF the whole module")
        lock.unlink()

    threading.Timer(0.5, finish).start()
    t0 = time.monotonic()
    kernel_build.wait_for_lock(str(tmp_path), "k", stale_s=600, poll_s=0.05)
    assert time.monotonic() - t0 > 0.4 and not lock.exists()
    assert so.read_bytes() == b"\x7fELF the whole module"
    assert "waiting for another process compiling the CPU kernels" in capsys.readouterr().err


def test_a_module_that_does_not_load_under_a_held_lock_is_left_alone(tmp_path, caplog):
    (tmp_path / "lock").write_bytes(b"")
    (tmp_path / "k.so").write_bytes(b"\x7fELF")
    with caplog.at_level(logging.WARNING):
        assert kernel_build.import_built("k", str(tmp_path)) is None
    assert (tmp_path / "k.so").read_bytes() == b"\x7fELF" and "another process holds" in caplog.text


WRITER = textwrap.dedent("""
    import os, sys, time
    folder, name, src = sys.argv[1:4]
    data = open(src, "rb").read()
    fd = os.open(os.path.join(folder, "lock"), os.O_CREAT | os.O_EXCL)  # torch's FileBaton
    time.sleep(0.05)
    with open(os.path.join(folder, name + ".so"), "wb") as f:  # the linker: the file first
        f.write(data[:16])
        f.flush()
        print("linking", flush=True)
        time.sleep(1.5)
        f.write(data[16:])
    os.close(fd)
    os.remove(os.path.join(folder, "lock"))
""")


def test_a_waiter_loads_the_module_another_process_is_linking(tmp_path, monkeypatch):
    """A second process holds the lock and has written 16 bytes of the module; this one loads the
    finished module, and the writer's file is whole (it was once removed under the writer)."""
    import torch.utils.cpp_extension as ext

    name, data = _real_module()
    src = tmp_path / "src.so"
    src.write_bytes(data)
    folder = tmp_path / "build"
    folder.mkdir()
    monkeypatch.setattr(ext, "_get_build_directory", lambda n, verbose: str(folder))
    monkeypatch.setattr(ext, "load_inline", lambda **kw: "rebuilt")  # the fallback path, stubbed
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(folder), name, str(src)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "linking"
        module = kernel_build.load_kernels(name, [], [], [], [])
        assert writer.wait(timeout=60) == 0
    finally:
        if writer.poll() is None:
            writer.kill()
    assert module != "rebuilt" and hasattr(module, "_escape_inner")
    assert (folder / f"{name}.so").read_bytes() == data


def test_an_older_module_under_a_live_lock_is_taken_at_once(tmp_path, monkeypatch):
    """A module older than the lock (a no-op check's lock, or one left by a killed process) loads
    without waiting: the case the direct import was made for."""
    import torch.utils.cpp_extension as ext

    name, data = _real_module()
    folder = tmp_path / "build"
    folder.mkdir()
    (folder / f"{name}.so").write_bytes(data)
    old = time.time() - 60
    os.utime(folder / f"{name}.so", (old, old))
    (folder / "lock").write_bytes(b"")
    monkeypatch.setattr(ext, "_get_build_directory", lambda n, verbose: str(folder))
    monkeypatch.setattr(ext, "load_inline", lambda **kw: "rebuilt")
    t0 = time.monotonic()
    assert hasattr(kernel_build.load_kernels(name, [], [], [], []), "_escape_inner")
    assert time.monotonic() - t0 < 5
