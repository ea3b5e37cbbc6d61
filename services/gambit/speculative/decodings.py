"""What a trace's ``decoding`` names: a shipped drafter, a drafter folder, or one this engine lacks."""

from __future__ import annotations

from pathlib import Path

SHIPPED = ("eagle3.1", "pr", "hass", "hass+pr")


def decoding_label(decoding: str) -> str:
    """A trace's decoding as a metric label: a shipped name, or "other" (a path would be unbounded)."""
    return decoding if decoding in SHIPPED else "other"


class DecodingUnavailable(ValueError):
    """A decoding this engine cannot draft: no drafter where its name points, or one made for another
    target (the services answer UNIMPLEMENTED: the request is valid, this Target lacks the drafter)."""


def drafter_path(decoding: str) -> Path:
    """The folder a decoding names when ``spec.drafters`` does not map it."""
    from gambit.paths import ASSETS

    if decoding in SHIPPED:  # "hass+pr" ships as drafter-hass-pr ("+" is no character for a folder name)
        return ASSETS / f"drafter-{decoding.replace('+', '-')}"
    return Path(decoding)
