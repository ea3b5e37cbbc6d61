"""A model folder's chat template (``tokenizer_config.json``), rendered for one user turn."""

from __future__ import annotations

import json
from pathlib import Path


def chat_template(folder: str | Path) -> str | None:
    """The folder's Jinja chat template, or None (no ``tokenizer_config.json``, or none in it: a base model
    such as the shipped target)."""
    conf = Path(folder) / "tokenizer_config.json"
    if not conf.is_file():
        return None
    try:
        return json.loads(conf.read_text()).get("chat_template") or None
    except json.JSONDecodeError as e:
        raise ValueError(f"{conf}: malformed JSON at line {e.lineno}: {e.msg}") from None


def render_user_turn(template: str, content: str) -> str:
    """``content`` as one user message through ``template``, ready for the assistant's answer."""
    import jinja2

    t = jinja2.Environment(keep_trailing_newline=True).from_string(template)
    return t.render(messages=[{"role": "user", "content": content}], add_generation_prompt=True)
