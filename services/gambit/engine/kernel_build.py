"""Loading the C++ CPU kernels: the built module straight from its cache folder, compiled only when absent.

``torch.utils.cpp_extension.load_inline`` takes a lock file in the build folder on every call, even when
the module is built and only ninja's no-op check runs; a process killed inside that window (a Ctrl-C or
a SIGTERM at start-up) leaves the file behind, and every later process waits on it forever, silently. So
a built module (its name holds the digest of its sources) is imported directly, with no lock; the lock is
taken only to compile. A lock older than any compile (``STALE_S``) is a dead process's: it is removed,
and said so. While a live process compiles, a waiting one says what it waits for.

A module file written since the lock was taken may be half-written: the linker creates it before it
writes it. So a waiter takes the module only when it predates the lock (then the lock is a no-op
check's, or a compile's that has not linked yet), else it waits for the lock to go; and a module that
does not load is removed only while no lock is held (under a lock it may be another process's, being
written: removing it once made both processes fall back to PyTorch).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import time
from types import ModuleType

log = logging.getLogger(__name__)

STALE_S = 600.0  # a lock file older than this is a dead compile's (one takes about a minute on 2 cores)


def build_folder(name: str) -> str | None:
    """The folder ``load_inline`` builds ``name`` in (None when torch's private helper is gone)."""
    try:
        from torch.utils.cpp_extension import _get_build_directory

        return _get_build_directory(name, verbose=False)
    except Exception:
        return None


def _mtime(path: str) -> float | None:
    try:
        return os.path.getmtime(path)
    except FileNotFoundError:
        return None


def import_built(name: str, folder: str) -> ModuleType | None:
    """The module already built in ``folder``, or None: not built, or one that does not load (a torn
    write, another torch's symbols). That one is removed so that the compile that follows replaces it
    (ninja alone would call it up to date), but only while no process holds the build lock and only
    the file that failed: under a lock it may be a compile's output, still being written."""
    path = os.path.join(folder, f"{name}.so")
    try:
        seen = os.stat(path)
    except FileNotFoundError:
        return None
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except (ImportError, OSError) as e:
        if os.path.exists(os.path.join(folder, "lock")):
            log.warning("the built CPU kernels at %s do not load (%s) while another process holds the "
                        "build lock; waiting for its compile", path, e)
            return None
        log.warning("the built CPU kernels at %s do not load (%s); building them again", path, e)
        try:
            now = os.stat(path)
            if (now.st_ino, now.st_mtime_ns) == (seen.st_ino, seen.st_mtime_ns):  # not a newer file
                os.remove(path)
        except OSError:
            pass
        return None


def wait_for_lock(folder: str, name: str, stale_s: float = STALE_S, poll_s: float = 0.5,
                  trust_older: bool = True) -> None:
    """Return once no other compile can be writing ``folder``'s module: the lock went, the lock is
    older than ``stale_s`` (removed: its process died), or (``trust_older``) the module predates the
    lock, so the lock's holder has not touched it. A module as new as the lock is not enough: the
    linker creates the file before it has written it. Says what it waits for, once."""
    lock, said = os.path.join(folder, "lock"), False
    while True:
        locked = _mtime(lock)
        if locked is None:
            return
        built = _mtime(os.path.join(folder, f"{name}.so"))
        if trust_older and built is not None and built < locked:
            return
        age = time.time() - locked
        if age > stale_s:
            try:
                os.remove(lock)
            except FileNotFoundError:
                pass
            print(f"gambit: removed a stale build lock ({lock}, {age:.0f} s old: its compile died)",
                  file=sys.stderr, flush=True)
            return
        if not said:
            print(f"gambit: waiting for another process compiling the CPU kernels (lock {lock}, "
                  f"{age:.0f} s old; removed as stale at {stale_s:.0f} s)", file=sys.stderr, flush=True)
            said = True
        time.sleep(poll_s)


def load_kernels(name: str, sources: list[str], functions: list[str], cflags: list[str],
                 ldflags: list[str]) -> ModuleType:
    """The kernel module ``name``: imported when built, else compiled (announced: ~40 s the first time)."""
    from torch.utils.cpp_extension import load_inline

    folder = build_folder(name)
    if folder is not None:
        wait_for_lock(folder, name)  # a compile in progress: its module may be half-written
        module = import_built(name, folder)
        if module is None and os.path.exists(os.path.join(folder, "lock")):  # an older module that does
            wait_for_lock(folder, name, trust_older=False)  # not load, and a compile that will replace it
            module = import_built(name, folder)
        if module is not None:
            return module
        print(f"gambit: compiling the CPU kernels once (about a minute on 2 cores; cached in {folder})",
              file=sys.stderr, flush=True)
    return load_inline(name=name, cpp_sources=sources, functions=functions, extra_cflags=cflags,
                       extra_ldflags=ldflags, verbose=False)
