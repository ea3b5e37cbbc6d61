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
    assert shipped.lost_chars("a b\n", shipped.encode("ab", add_bos=False)) == []  # whitespace aside
    assert shipped.lost_chars("a€b€", shipped.encode("ab", add_bos=False)) == ["€"]


def _sentencepiece_style() -> Tokenizer:
    """A Llama-2-style tokenizer: spaces become U+2581 in its normalizer, a leading one is prepended, and
    characters outside its alphabet fall back to byte tokens."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, normalizers

    vocab = {"<unk>": 0, "\u2581": 1}
    for c in "abcdefghijklmnopqrstuvwxyz0123456789+=?":
        vocab[c] = len(vocab)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return Tokenizer(tok, None, [], None)


def test_a_sentencepiece_style_vocabulary_is_not_refused():
    """Its normalized text holds U+2581 for every space, and its byte tokens carry any other character:
    nothing is lost, nothing refused."""
    tok = _sentencepiece_style()
    text = "what is 3 × 4 = ? café"
    ids = tok.encode_checked(text, add_bos=False)
    assert ids == tok.encode(text, add_bos=False) and tok.decode(ids) == text


def test_a_byte_level_vocabulary_represents_everything(smollm2_folder):
    tok = load_model(smollm2_folder)[1]
    text = "Say café ☕ 中文\t\nx\u00a0y"
    assert tok.encode_checked(text) == tok.encode(text)


@pytest.mark.parametrize("text, read_as", [
    ("Compute 12\u00a0345+1.", "Compute 12 345+1."),  # a no-break space: dropped, it read 12345
    ("Compute\t(4+5)*3.", "Compute (4+5)*3."),
    ("Compute 4+5.\r\nThen\u2009*3.\rDone\u2028x", "Compute 4+5.\nThen *3.\nDone\nx"),
])
def test_whitespace_the_vocabulary_lacks_is_read_as_a_space_or_a_newline(shipped, text, read_as):
    assert shipped.encode_checked(text, "problem") == shipped.encode(read_as)
    assert shipped.kept_whitespace(read_as) == read_as


def test_a_vocabulary_that_keeps_whitespace_gets_it_as_it_is():
    tok = _sentencepiece_style()  # byte fallback carries a tab and a no-break space
    text = "a\tb\u00a0c"
    assert tok.kept_whitespace(text) == text
    assert tok.decode(tok.encode_checked(text, add_bos=False)) == text
