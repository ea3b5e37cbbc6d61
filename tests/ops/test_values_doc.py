"""helm/README.md's values table: every key of values.yaml, its default and its comment; drift is reported."""

from __future__ import annotations

import re
import shutil

import yaml

from gambit.cli import main
from gambit.ops.generate import REPO, VALUES, check, generate
from gambit.ops.values_doc import documented_keys, values_readme

SAMPLE = """\
# -- The image.
image:
  repository: gambit
  tag: ""  # defaults to the chart's appVersion
list:
  - a: 1  # a list item's keys are the value's, not the chart's
    b: 2
flow: {x: 1}  # a flow map is one value
url: "redis://h:6379/0#frag"  # the '#' inside quotes is no comment

after: 3
"""


def leaves(d: dict, at: str = "") -> set[str]:
    out = set()
    for k, v in d.items():
        out.add(at + k)
        if isinstance(v, dict):
            out |= leaves(v, at + k + ".")
    return out


def test_keys_defaults_and_comments_are_read_from_the_lines():
    keys = {k: (about, inline) for k, about, inline in documented_keys(SAMPLE)}
    assert list(keys) == ["image", "image.repository", "image.tag", "list", "flow", "url", "after"]
    assert keys["image"] == ("The image.", False)
    assert keys["image.tag"] == ("defaults to the chart's appVersion", True)
    assert keys["url"][0] == "the '#' inside quotes is no comment"
    text = values_readme(SAMPLE)
    assert "| `flow` | `{\"x\": 1}` | a flow map is one value |" in text
    assert "| `url` | `redis://h:6379/0#frag` |" in text and "| `image` | (section) | The image. |" in text
    assert "| `image.tag` | `\"\"` |" in text and "list.a" not in text


def test_the_table_lists_every_key_of_the_charts_values():
    text = (REPO / VALUES).read_text()
    listed = {k for k, _, _ in documented_keys(text)}
    flow = {k for k, _, inline in documented_keys(text) if inline}
    # every key a user can set is a row (keys inside a flow map or a list are that value's)
    want = {k for k in leaves(yaml.safe_load(text)) if not any(k.startswith(f + ".") for f in flow)}
    assert listed == want
    assert (REPO / "helm/README.md").read_text() == values_readme(text)


def test_a_values_comment_changed_without_generate_is_drift(tmp_path):
    shutil.copytree(REPO / "helm", tmp_path / "helm")
    shutil.copytree(REPO / "deploy", tmp_path / "deploy")
    assert check(tmp_path) == []
    values = tmp_path / VALUES
    values.write_text(re.sub(r'(?m)^(  tag: ""  # ).*$', r"\1the image tag", values.read_text(), count=1))
    (diff,) = check(tmp_path)
    assert "helm/README.md" in diff and "+| `image.tag` | `\"\"` | the image tag |" in diff
    assert generate(tmp_path) == [tmp_path / "helm/README.md"]  # absolute paths: where they went


def test_deploy_refuses_a_folder_that_is_no_checkout(tmp_path, capsys, monkeypatch):
    """From a pip-installed gambit it wrote deploy/ and helm/ beside site-packages: refused now."""
    assert main(["deploy", "generate", "--root", str(tmp_path)]) == 2
    assert f"{tmp_path} is no Gambit checkout (no {VALUES})" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    monkeypatch.chdir(tmp_path)  # the current folder is no checkout: the installed one is checked
    assert main(["deploy", "check"]) == 0
    assert capsys.readouterr().out.strip() == f"{REPO}: deploy/ matches the code"
