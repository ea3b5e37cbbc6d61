"""Our tokenizer and chat template against transformers': the same ids, the same text, the same prompt.

The SmolLM2 cases need the converted checkpoint (``make fetch-smollm2``) and skip without it; the
template cases use the shipped character tokenizer saved as a folder transformers can load.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from gambit.model.chat_template import chat_template, render_user_turn
from gambit.model.registry import model_dir
from gambit.model.tokenizer import Tokenizer, build_char_tokenizer, write_tokenizer_config

DATASETS = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"
STRESS = [
    "中文 テスト 한국어", "😀👍🏽👨\u200d👩\u200d👧 ok", "e\u0301 a\u0308 n\u0303",
    "12\u00a0345 and 1\u2009000",
    "שלום עולם مرحبا بالعالم", r"$\frac{a}{b} + \sum_{i=1}^{n} x_i^2 \leq \sqrt[3]{\pi}$",
    "def f():\r\n\tx = 1   \r\n\treturn x\t\t\n", "1234567890123456789012345678901234567890",
    "a    b\n\n\n\n   c  ", "<|im_start|>user\nhi<|im_end|>", "x<|endoftext|>y", " <|im_end|> ",
    "\u200b\ufeffzero width", "", " ", "\n", "\t", "  leading", "trailing  ", "\x00\x01\x7f",
]


@pytest.fixture(scope="module")
def smollm2():
    folder = model_dir("smollm2")
    if not (folder / "tokenizer.json").is_file():
        pytest.skip("SmolLM2 not fetched (make fetch-smollm2)")
    from transformers import AutoTokenizer

    from gambit.model.loader import load_tokenizer

    return load_tokenizer(str(folder)), AutoTokenizer.from_pretrained(folder)


def _dataset_texts(per_file: int = 150) -> list[str]:
    """Up to ``per_file`` lines' strings of each dataset (problems, answers, code), a fixed sample."""
    texts: list[str] = []
    for path in sorted(DATASETS.glob("*.jsonl")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for line in random.Random(0).sample(lines, min(per_file, len(lines))):
            texts += [v for v in json.loads(line).values() if isinstance(v, str)]
    return texts


def test_ids_and_text_equal_transformers_on_datasets_and_stress_cases(smollm2):
    tok, hf = smollm2
    texts = _dataset_texts() + STRESS
    assert len(texts) > 500 or not DATASETS.is_dir()
    for text in texts:
        ids = tok.encode(text, add_bos=False)
        assert ids == hf.encode(text, add_special_tokens=False), text[:80]
        for skip in (True, False):
            assert tok.decode(ids, skip_special=skip) == hf.decode(ids, skip_special_tokens=skip), text[:80]
        assert tok.decode(ids, skip_special=False) == text


def test_special_token_text_is_one_token_as_transformers_reads_it(smollm2):
    """transformers' default (``split_special_tokens=False``): "<|im_start|>" in text is the control token;
    raw text from a user must therefore go through the server's prompt format (see docs/notes/engine.md)."""
    tok, hf = smollm2
    start = hf.convert_tokens_to_ids("<|im_start|>")
    assert tok.encode("a<|im_start|>b", add_bos=False).count(start) == 1
    assert tok.decode(tok.encode("a<|im_start|>b", add_bos=False)) == "ab"  # skipped as transformers does


def _streamed(tok: Tokenizer, ids: list[int], skip_special: bool = True) -> list[str]:
    step = tok.stream(skip_special)
    return [step(i) for i in ids]


def test_streamed_pieces_join_to_the_full_decode(smollm2):
    tok, _ = smollm2
    for text in STRESS + ["Say café ☕ 中文 😀 then <|im_end|> done"]:
        ids = tok.encode(text, add_bos=False)
        for skip in (True, False):
            assert "".join(_streamed(tok, ids, skip)) == tok.decode(ids, skip_special=skip), text
    ids = tok.encode("😀", add_bos=False)
    assert len(ids) > 1 and "".join(tok.decode([i]) for i in ids) != "😀"  # one id at a time: U+FFFD
    pieces = _streamed(tok, ids)
    assert pieces[-1] == "😀" and not any(pieces[:-1])  # the character comes whole, with its last byte


def test_streaming_the_character_tokenizer():
    tok = build_char_tokenizer()
    ids = tok.encode("Hi  there\n\nx = 1 ", add_bos=True) + tok.eos_ids
    assert "".join(_streamed(tok, ids)) == tok.decode(ids) == "Hi  there\n\nx = 1 "


def test_a_4kb_prompt_encodes_about_as_fast_as_transformers(smollm2):
    tok, hf = smollm2
    text = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many in May. "
            "How many clips did Natalia sell altogether in April and May? $x^2 + 3 = 12$\n") * 28
    text = text[:4096]

    def best(f) -> float:
        times = []
        for _ in range(5):
            t = time.perf_counter()
            f(text)
            times.append(time.perf_counter() - t)
        return min(times)

    assert best(tok.encode_checked) < 5 * best(hf.encode) + 0.002


# -- chat templates ------------------------------------------------------------------------------

MULTILINE = ("{% for m in messages %}\n<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
             "{% endfor %}\n{% if add_generation_prompt %}\n  <|im_start|>assistant\n{% endif %}\n")
BOS_EOS = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}"
           "{% endfor %}")
GUARDED = ("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
           "{{ messages[0]['content'] | tojson }}{% if strftime_now('%Y') %}!{% endif %}")
CONTENT = 'Find x: café "q" <b> 😀\n\tthen\n'


def _char_folder(tmp_path: Path, template: str | None = None, jinja_file: str | None = None) -> Path:
    build_char_tokenizer().save(tmp_path / "tokenizer.json")
    write_tokenizer_config(tmp_path)
    if template is not None:
        conf = json.loads((tmp_path / "tokenizer_config.json").read_text())
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(conf | {"chat_template": template}))
    if jinja_file is not None:
        (tmp_path / "chat_template.jinja").write_text(jinja_file)
    return tmp_path


def _transformers_render(folder: Path) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder).apply_chat_template(
        [{"role": "user", "content": CONTENT}], tokenize=False, add_generation_prompt=True)


@pytest.mark.parametrize("template", [MULTILINE, BOS_EOS, GUARDED], ids=["multiline", "bos_eos", "guarded"])
def test_template_renders_what_transformers_renders(tmp_path, template):
    folder = _char_folder(tmp_path, template)
    assert render_user_turn(chat_template(folder), CONTENT) == _transformers_render(folder)


def test_a_chat_template_jinja_file_is_read_first(tmp_path):
    folder = _char_folder(tmp_path, "ignored {{ messages[0]['content'] }}", jinja_file=BOS_EOS + "\n")
    assert render_user_turn(chat_template(folder), CONTENT) == _transformers_render(folder)


def test_named_templates_give_the_default(tmp_path):
    folder = _char_folder(tmp_path, [{"name": "tool_use", "template": "tools"},
                                     {"name": "default", "template": BOS_EOS}])
    assert render_user_turn(chat_template(folder), CONTENT) == f"<bos>user: {CONTENT}<eos>"


def test_named_templates_without_a_default_are_refused(tmp_path):
    """transformers refuses them ("multiple chat templates with no default"); read as no template, a chat
    model was prompted as a base model without a word."""
    folder = _char_folder(tmp_path, [{"name": "tool_use", "template": "tools"}])
    with pytest.raises(ValueError, match='without a "default" one \\(names: tool_use\\)'):
        chat_template(folder)


def test_a_template_that_refuses_or_escapes_the_sandbox_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="chat_template: TemplateError: no"):
        render_user_turn("{{ raise_exception('no') }}", CONTENT)
    with pytest.raises(ValueError, match="chat_template: SecurityError"):
        render_user_turn("{{ messages.__class__.__subclasses__() }}", CONTENT)
    folder = _char_folder(tmp_path, {"not": "a template"})
    with pytest.raises(ValueError, match="chat_template must be a string"):
        chat_template(folder)


def test_smollm2_template_equals_transformers(smollm2):
    _, hf = smollm2
    ref = hf.apply_chat_template([{"role": "user", "content": CONTENT}], tokenize=False,
                                 add_generation_prompt=True)
    assert render_user_turn(chat_template(model_dir("smollm2")), CONTENT) == ref


def test_a_template_that_writes_the_bos_gets_one_bos(tmp_path):
    """transformers encodes a render without special tokens: ``{{ bos_token }}`` gives the only BOS."""
    tok = build_char_tokenizer()
    prompt = render_user_turn(chat_template(_char_folder(tmp_path, BOS_EOS)), "2+2")
    assert prompt.startswith("<bos>")
    ids = tok.encode_checked(prompt)
    assert ids == tok.encode(prompt) == tok.encode(prompt, add_bos=False) and ids.count(tok.bos_id) == 1
    assert tok.encode("2+2")[:2] == [tok.bos_id, tok.encode("2", add_bos=False)[0]]
