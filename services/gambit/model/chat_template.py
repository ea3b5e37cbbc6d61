"""A model folder's chat template, rendered for one user turn as transformers' ``apply_chat_template`` does.

Rendering must match transformers byte for byte: the model was trained on what it renders. So the same
Jinja settings (``trim_blocks``, ``lstrip_blocks``, no kept trailing newline: a multi-line template
otherwise gains newlines), the same names a template may use (``bos_token`` and the other special tokens
of ``tokenizer_config.json``, ``raise_exception``, ``strftime_now``, a ``tojson`` that keeps non-ASCII),
and a sandbox (a template is code from the checkpoint's author).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                      "mask_token")


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template and the special tokens it may name (``{{ bos_token }}``)."""

    source: str
    special_tokens: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source:
            raise ValueError(f"chat_template: must be a non-empty Jinja string, got {self.source!r}")


def _token_text(value) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string, or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _pick_template(value, conf: Path) -> str | None:
    """The template itself; a list of named templates (``[{"name", "template"}]``) gives "default", and
    one without it is refused as transformers refuses it (read as no template, a chat model was prompted
    as a base model, without a word)."""
    if value is None or isinstance(value, str):
        return value or None
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if not named.get("default"):
            raise ValueError(f"{conf}: chat_template lists named templates without a \"default\" one "
                             f"(names: {', '.join(map(str, named)) or 'none'})")
        return named["default"]
    raise ValueError(f"{conf}: chat_template must be a string or a list of named templates, "
                     f"got {type(value).__name__}")


def chat_template(folder: str | Path) -> ChatTemplate | None:
    """The folder's chat template, or None (a base model such as the shipped target). Read from
    ``chat_template.jinja`` when present (transformers writes it there since 4.43, and prefers it), else
    from ``tokenizer_config.json``'s ``chat_template``."""
    folder = Path(folder)
    conf = folder / "tokenizer_config.json"
    try:
        config = json.loads(conf.read_text()) if conf.is_file() else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"{conf}: malformed JSON at line {e.lineno}: {e.msg}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{conf}: must hold a JSON object, got {type(config).__name__}")
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        source = jinja_file.read_text()
    else:
        source = _pick_template(config.get("chat_template"), conf)
    if not source:
        return None
    specials = {k: t for k in SPECIAL_TOKEN_KEYS if (t := _token_text(config.get(k))) is not None}
    return ChatTemplate(source, specials)


@lru_cache(maxsize=8)
def _compile(source: str):
    """``source`` in transformers' Jinja environment (``chat_template_utils._compile_jinja_template``);
    cached: a server renders every problem through the same template."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def render_user_turn(template: ChatTemplate | str, content: str) -> str:
    """``content`` as one user message through ``template``, ready for the assistant's answer. A template
    that refuses it (``raise_exception``) or is broken is a ValueError saying so, not a Jinja traceback."""
    import jinja2

    if isinstance(template, str):
        template = ChatTemplate(template)
    try:
        compiled = _compile(template.source)
        return compiled.render(messages=[{"role": "user", "content": content}], add_generation_prompt=True,
                               **template.special_tokens)
    except jinja2.exceptions.TemplateError as e:
        raise ValueError(f"chat_template: {type(e).__name__}: {e}") from None
