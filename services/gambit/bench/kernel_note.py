"""Whether a bench's native engine ran on the C++ CPU kernels (``gambit.engine.cpu_attention``).

Without them the engine takes its PyTorch path: several times slower, and a run that lost a build race
with another process (or has no compiler) measured that path while its table looked as usual. The
engine only logs a warning, so every bench that times the engine puts this note in its result's
``notes`` and under its table.
"""

from __future__ import annotations

import os


def cpu_kernels_note() -> str:
    """"" when the kernels loaded in this process or were never asked for (a CUDA run); else the note."""
    from gambit.engine import cpu_attention

    if cpu_attention._module is not None or not cpu_attention._failed:  # its load state
        return ""
    why = ("GAMBIT_NO_CPU_KERNEL is set" if os.environ.get("GAMBIT_NO_CPU_KERNEL")
           else "no compiler, or the build failed or did not load: see the warning above")
    return f"the C++ CPU kernels did not load ({why}): these figures are the slower PyTorch path's"


def grouped(notes: dict[str, str]) -> list[str]:
    """``{label: note}`` (empty notes left out) as one line per distinct note naming its labels."""
    by: dict[str, list[str]] = {}
    for label, note in notes.items():
        if note:
            by.setdefault(note, []).append(label)
    return [f"{', '.join(labels)}: {note}" for note, labels in by.items()]
