"""Fixtures of the ops tests: the real helm/promtool (installed by `make ops-tools`) and the chart
rendered once per ci/ values file."""

from __future__ import annotations

import pytest
from ops_util import CI_VALUES, render, tool


@pytest.fixture(scope="session")
def helm() -> str:
    return tool("helm")


@pytest.fixture(scope="session")
def promtool() -> str:
    return tool("promtool")


@pytest.fixture(scope="session")
def rendered(helm) -> dict[str, list[dict]]:
    """values-file stem ("default" for the chart's own values) -> rendered objects."""
    out = {"default": render(helm)}
    for f in CI_VALUES:
        out[f.stem] = render(helm, "-f", str(f))
    return out
