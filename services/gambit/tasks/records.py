"""Reading a benchmark file: JSONL (or one JSON array) whose bad lines fail loudly.

A line that is not JSON or lacks a required field raises ``ValueError`` naming the file, the 1-based line
number and the field, so a truncated download is never scored as a bad model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _records(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(``"<file> line <n>"``, object) for each non-blank line of a JSONL file, n 1-based.

    A ``.json`` file is read as one JSON array instead (some published copies, e.g. sanitized MBPP, come
    that way); its objects are then located as ``"<file> item <n>"``.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"benchmark file not found: {p}")
    try:  # utf-8-sig: a byte-order mark (a common export) is dropped, not read as the first JSON's text
        text = p.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); "
                         "save the file as UTF-8") from None
    if p.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{p} line {e.lineno}: not valid JSON ({e.msg})") from e
        except (ValueError, RecursionError) as e:
            raise ValueError(f"{p}: not readable JSON ({_why(e)})") from None
        if not isinstance(data, list):
            raise ValueError(f"{p}: expected a JSON array of objects, got {type(data).__name__}")
        rows = [(f"{p} item {n}", obj) for n, obj in enumerate(data, start=1)]
    else:
        rows = []
        for n, line in enumerate(text.split("\n"), start=1):  # not splitlines: U+2028 may sit in a string
            if not line.strip():
                continue
            try:
                rows.append((f"{p} line {n}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise ValueError(f"{p} line {n}: not valid JSON ({e.msg})") from e
            except (ValueError, RecursionError) as e:  # a number over the digit limit, deep nesting
                raise ValueError(f"{p} line {n}: not readable JSON ({_why(e)})") from None
    for where, obj in rows:
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        yield where, obj


def _why(e: Exception) -> str:
    """A JSON error in a few words: the digit limit's message runs to a paragraph, recursion's names
    Python's internals. Both escaped bare, naming no file or line."""
    return "nested too deeply" if isinstance(e, RecursionError) else str(e).split(";")[0]


def _req(obj: dict[str, Any], key: str, where: str) -> Any:
    """``obj[key]``, or a ValueError naming the file, line and missing field."""
    if key not in obj or obj[key] is None:
        raise ValueError(f"{where}: missing field {key!r}")
    return obj[key]


def _req_str(obj: dict[str, Any], key: str, where: str) -> str:
    """A required field as a string (numbers such as AIME answers are accepted and converted)."""
    v = _req(obj, key, where)
    if isinstance(v, bool) or not isinstance(v, str | int | float):
        raise ValueError(f"{where}: field {key!r} should be a string, got {type(v).__name__}")
    return str(v)


def _req_text(obj: dict[str, Any], key: str, where: str) -> str:
    """A required question text: a blank one was loaded and sent to the model as an empty prompt."""
    v = _req_str(obj, key, where)
    if not v.strip():
        raise _bad(where, key, "is empty")
    return v


def _bad(where: str, key: str, why: str) -> ValueError:
    return ValueError(f"{where}: field {key!r} {why}")

