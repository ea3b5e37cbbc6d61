"""``Tokenizer.encode_checked``: text the vocabulary cannot represent is refused, naming the characters,
where ``encode`` would drop them silently (the shipped target knows printable ASCII only)."""

from __future__ import annotations

import pytest

from gambit.model import Tokenizer, load_model
from gambit.paths import TARGET


@pytest.fixture(scope="module")
def shipped() -> Tokenizer:
    return load_model(str(TARGET))[1]


def test_representable_text_encodes_as_encode_does(shipped):
    text = "Compute: (12 + 7) * 3 = ?\n\nThen {x} ~ y_1!"
    assert shipped.encode_checked(text) == shipped.encode(text)
    assert shipped.encode_checked(text, add_bos=False) == shipped.encode(text, add_bos=False)


def test_unrepresentable_characters_are_named(shipped):
    text = "café ☕: 2 + 2"
    assert len(shipped.encode(text)) == len(shipped.encode("caf : 2 + 2"))  # what encode does: drops them
    with pytest.raises(ValueError) as e:
        shipped.encode_checked(text, "problem")
    msg = str(e.value)
    assert msg.startswith("problem: ") and "'é' (U+00E9)" in msg and "'☕' (U+2615)" in msg
    assert "'c'" not in msg and "'2'" not in msg


def test_many_unrepresentable_characters_are_summarised(shipped):
    with pytest.raises(ValueError, match=r"and 4 more$"):
        shipped.encode_checked("αβγδεζηθικλμ")


def test_only_what_is_lost_is_named(shipped):
    assert shipped.lost_chars("ab", shipped.encode("ab", add_bos=False)) == []
    assert shipped.lost_chars("abb", shipped.encode("a", add_bos=False)) == ["b"]
    assert shipped.lost_chars("a b\n", shipped.encode("ab", add_bos=False)) == []  # whitespace aside


def test_a_byte_level_vocabulary_represents_everything(smollm2_folder):
    tok = load_model(smollm2_folder)[1]
    text = "Say café ☕ 中文\t\nx\u00a0y"
    assert tok.encode_checked(text) == tok.encode(text)
