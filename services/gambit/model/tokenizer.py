"""Tokenizer over a Hugging Face ``tokenizer.json``, plus the character-level one we ship.

The thought boundary ``\\n\\n`` must be recognisable from token ids alone: ``boundary_ids`` are
all tokens whose text contains it (our tokenizer has exactly one; byte-level BPE vocabularies of
real checkpoints have several). Byte-level BPE with GPT-2's pre-tokenizer also splits ``"\\n\\nWord"``
into two ``"\\n"`` tokens, so ``newline_end_ids`` / ``newline_start_ids`` let the engine see a boundary
formed across two tokens (see ``gambit.engine.boundary``).
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, processors

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
BOUNDARY = "\n\n"
LINE_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # whitespace str.splitlines breaks at, but \n


def post_processor_bos(tok: HFTokenizer) -> tuple[bool, int | None]:
    """(whether the file says, the BOS id its post-processor puts first): what transformers' tokenizer
    adds. A byte-level one (Qwen2, SmolLM2) adds none although config.json names a ``bos_token_id``;
    prepending that id anyway fed every prompt an ``<|endoftext|>`` the model never saw first. No
    post-processor (the shipped tokenizer): not said, config.json's id is prepended."""
    if tok.post_processor is None:
        return False, None
    procs, flat = [json.loads(tok.post_processor.__getstate__())], []
    while procs:  # a Sequence (Llama 3: ByteLevel then TemplateProcessing), nested or not, in order
        proc = procs.pop(0)
        if proc.get("type") == "Sequence":
            procs = proc.get("processors", []) + procs
        else:
            flat.append(proc)
    for proc in flat:
        if proc.get("type") in ("BertProcessing", "RobertaProcessing"):
            return True, proc["cls"][1]
        if proc.get("type") == "TemplateProcessing":
            first = (proc.get("single") or [{}])[0]
            if "SpecialToken" not in first:
                return True, None
            ids = proc.get("special_tokens", {}).get(first["SpecialToken"]["id"], {}).get("ids")
            return True, ids[0] if ids else None
    return True, None


class Tokenizer:
    def __init__(self, tok: HFTokenizer, bos_id: int | None, eos_ids: list[int], pad_id: int | None) -> None:
        self.tok = tok
        self.bos_id = bos_id
        self.eos_ids = eos_ids
        self.pad_id = pad_id if pad_id is not None else (eos_ids[0] if eos_ids else 0)

    @classmethod
    def from_file(cls, path: str | Path, bos_id: int | None = None, eos_ids: list[int] | None = None,
                  add_bos: bool = False) -> Tokenizer:
        """``bos_id`` is prepended unless the file's post-processor says which BOS it adds, if any
        (``add_bos``: the checkpoint's tokenizer_config.json says it adds one, keep ``bos_id``)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no tokenizer.json in the model folder")
        try:
            tok = HFTokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises plain Exceptions
            raise ValueError(f"{path}: malformed tokenizer: {e}") from None
        known, template_bos = post_processor_bos(tok)
        if known and (template_bos is not None or not add_bos):
            bos_id = template_bos
        elif bos_id is None:
            bos_id = tok.token_to_id(BOS)
        if not eos_ids:
            eos = tok.token_to_id(EOS)
            eos_ids = [eos] if eos is not None else []
        return cls(tok, bos_id, eos_ids, tok.token_to_id(PAD))

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False).ids
        return self._with_bos(ids, add_bos)

    def _with_bos(self, ids: list[int], add_bos: bool) -> list[int]:
        """``ids`` after one BOS: none added where the text began with it (a chat template that writes
        ``{{ bos_token }}``, as Llama 3's does; transformers encodes its render without adding another)."""
        if not add_bos or self.bos_id is None or ids[:1] == [self.bos_id]:
            return ids
        return [self.bos_id] + ids

    def encode_checked(self, text: str, field: str = "prompt", add_bos: bool = True) -> list[int]:
        """``encode``, refusing text the vocabulary cannot represent. A vocabulary without an unknown
        token drops such characters silently (the shipped target's knows printable ASCII only), and a
        problem read without them is another problem: ValueError naming ``field`` and the characters.
        Whitespace it lacks is read as a space or a newline (``kept_whitespace``), not refused."""
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if self.tok.decode(ids, skip_special_tokens=False) != text:
            kept = self.kept_whitespace(text)
            if kept != text:
                text, ids = kept, self.tok.encode(kept, add_special_tokens=False).ids
        bad = self.lost_chars(text, ids)
        if bad:
            shown = ", ".join(f"{c!r} (U+{ord(c):04X})" for c in bad[:8])
            more = f" and {len(bad) - 8} more" if len(bad) > 8 else ""
            raise ValueError(f"{field}: characters the model's vocabulary cannot represent: {shown}{more}")
        return self._with_bos(ids, add_bos)

    def kept_whitespace(self, text: str) -> str:
        """``text`` with each whitespace character the vocabulary drops read as a space, a line break as a
        newline (CR LF as one): dropped, a tab or a no-break space joined what it separated ("12\u00a0345"
        was read as 12345). A vocabulary that keeps them (byte-level, byte fallback) gets the text as is."""
        lost = {c for c in set(text) if c.isspace() and self._drops(c)}
        if not lost:
            return text
        if "\r" in lost:
            text = text.replace("\r\n", "\n")
        return text.translate({ord(c): "\n" if c in LINE_BREAKS else " " for c in lost})

    def _drops(self, space: str) -> bool:
        """Whether a whitespace character vanishes between two letters (alone, a BPE model may give no
        token for one it keeps in context)."""
        ids = self.tok.encode(f"a{space}a", add_special_tokens=False).ids
        return self.tok.decode(ids, skip_special_tokens=False) == "aa"

    def lost_chars(self, text: str, ids: list[int]) -> list[str]:
        """The characters of ``text`` that ``ids`` do not hold, whitespace aside. Where the ids decode back
        to the text, none; else each distinct character is encoded alone, and one that gives no token is
        lost (a character outside a BPE alphabet without byte fallback or an unknown token, or one a
        normalizer removes). Neither the tokens' character spans (a BPE model that drops a character
        shifts the spans after it) nor a character count against the normalized text (SentencePiece's
        normalizer turns spaces into U+2581, NFC composes accents) tells which."""
        if self.tok.decode(ids, skip_special_tokens=False) == text:
            return []
        chars = sorted({c for c in text if not c.isspace()})
        return [c for c in chars if not self.tok.encode(c, add_special_tokens=False).ids]

    @cached_property
    def special_ids(self) -> frozenset[int]:
        """Ids of the special added tokens (BOS, EOS, a chat model's turn markers): the tokenizer reads
        their text as the token wherever it stands, so text that holds one writes a control token."""
        return frozenset(i for i, t in self.tok.get_added_tokens_decoder().items() if t.special)

    def first_special(self, text: str) -> tuple[str, int] | None:
        """The first special token ``text`` encodes to and its character offset, or None. Read from the
        encoding, not by a text search: a normalizer or an ``lstrip`` token can match other text."""
        if not self.special_ids:
            return None
        enc = self.tok.encode(text, add_special_tokens=False)
        found = self.special_ids.intersection(enc.ids)
        if not found:
            return None
        k = min(enc.ids.index(i) for i in found)
        return self.tok.id_to_token(enc.ids[k]), enc.offsets[k][0]

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special)

    def stream(self, skip_special: bool = True) -> Callable[[int], str]:
        """``id -> text piece`` for detokenising one sequence as it is generated: the pieces join to
        ``decode`` of the ids. Decoding each id alone does not: a character of several UTF-8 bytes split
        across byte-level tokens (an emoji, CJK) gives U+FFFD per fragment; here it comes whole, with the
        token that completes it (until then, "")."""
        state = decoders.DecodeStream(skip_special_tokens=skip_special)
        return lambda token_id: state.step(self.tok, int(token_id)) or ""

    @cached_property
    def token_texts(self) -> list[str]:
        """Decoded text of every id on its own (byte fragments decode to U+FFFD)."""
        return self.tok.decode_batch([[i] for i in range(self.vocab_size)], skip_special_tokens=False)

    @cached_property
    def boundary_ids(self) -> frozenset[int]:
        """Token ids whose decoded text contains the thought boundary ``\\n\\n``."""
        return frozenset(i for i, t in enumerate(self.token_texts) if BOUNDARY in t)

    @cached_property
    def newline_end_ids(self) -> frozenset[int]:
        """Texts ending in exactly one newline (after two, a boundary has already happened)."""
        texts = self.token_texts
        return frozenset(i for i, t in enumerate(texts) if t.endswith("\n") and not t.endswith(BOUNDARY))

    @cached_property
    def newline_start_ids(self) -> frozenset[int]:
        return frozenset(i for i, t in enumerate(self.token_texts) if t.startswith("\n"))

    def save(self, path: str | Path) -> None:
        """tokenizer.json; one without a post-processor gets a template that puts ``bos_id`` first, as
        ``encode`` does: transformers (5) reads only the file's post-processor (tokenizer_config.json's
        ``add_bos_token`` is dropped beside a tokenizer.json), so it encoded our checkpoints without
        the BOS they were trained with. Our loader reads the same BOS back from the template."""
        tok = self.tok
        if tok.post_processor is None and self.bos_id is not None:
            tok = HFTokenizer.from_str(tok.to_str())  # a copy: this tokenizer stays as it is
            bos = tok.id_to_token(self.bos_id)
            if bos is None:
                raise ValueError(f"bos id {self.bos_id} is not in the vocabulary ({self.vocab_size} tokens)")
            tok.post_processor = processors.TemplateProcessing(
                single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                special_tokens=[(bos, self.bos_id)])
        tok.save(str(path))


def build_char_tokenizer() -> Tokenizer:
    """Characters of printable ASCII plus ``\\n`` and one merged ``\\n\\n`` token; ids 0-2 special."""
    chars = ["\n"] + [c for c in string.printable if c not in "\n\r\t\x0b\x0c"]
    vocab = {PAD: 0, BOS: 1, EOS: 2}
    for c in chars:
        vocab[c] = len(vocab)
    vocab[BOUNDARY] = len(vocab)
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=[("\n", "\n")]))
    tok.add_special_tokens([PAD, BOS, EOS])
    tok.decoder = decoders.Fuse()
    return Tokenizer(tok, 1, [2], 0)


def write_tokenizer_config(folder: Path, tokenizer: Tokenizer | None = None, max_length: int = 1024) -> None:
    """``tokenizer_config.json`` so ``transformers.AutoTokenizer`` loads the folder too, naming
    ``tokenizer``'s own special tokens (default: the shipped character tokenizer's). It said
    ``add_bos_token: false`` of a tokenizer that prepends BOS, and named ``<bos>`` / ``<eos>`` /
    ``<pad>`` whatever the vocabulary held (transformers adds a token it does not find)."""
    tok = tokenizer or build_char_tokenizer()

    def text(i: int | None) -> str | None:
        return None if i is None else tok.tok.id_to_token(i)

    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": text(tok.bos_id),
        "eos_token": text(tok.eos_ids[0] if tok.eos_ids else None), "pad_token": text(tok.pad_id),
        "add_bos_token": tok.bos_id is not None, "model_max_length": max_length}, indent=2))
