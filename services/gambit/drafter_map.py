"""``--drafters pr=FOLDER,eagle3.1=FOLDER``: which drafter a decoding name drafts with (torch-free: the
services' launchers read it before any model loads)."""

from __future__ import annotations


def parse_drafters(text: str, names: tuple[str, ...] = ("eagle3.1", "pr")) -> dict[str, str]:
    """``"pr=/path/a,eagle3.1=/path/b"`` -> ``{"pr": "/path/a", "eagle3.1": "/path/b"}`` (the CLI's and
    the services' form of ``SpecConfig.drafters``); a malformed item or a name not in ``names`` is a
    ValueError saying which."""
    out: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, eq, folder = item.partition("=")
        name, folder = name.strip(), folder.strip()
        if not eq or not folder:
            raise ValueError(f"drafters: {item!r} must be NAME=FOLDER "
                             "(e.g. pr=~/.cache/gambit/drafters/smollm2-pr)")
        if name not in names:
            raise ValueError(f"drafters: {name!r} is not a decoding; one of {', '.join(names)}")
        out[name] = folder
    return out
