"""Loader and tokenizer: clear errors naming the bad file, save/load round-trip, the char tokenizer."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gambit.model import CausalLM, ModelConfig, Tokenizer, build_char_tokenizer, load_model, save_model
from gambit.model.tokenizer import BOUNDARY
from gambit.tasks.arithmetic import SPLITS, TaskConfig, generate


def _tiny_config(**kw) -> ModelConfig:
    tok = build_char_tokenizer()
    return ModelConfig(**{"vocab_size": tok.vocab_size, "hidden_size": 16, "intermediate_size": 24,
                          "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                          "max_position_embeddings": 64, "bos_token_id": tok.bos_id,
                          "eos_token_id": tok.eos_ids[0], "pad_token_id": tok.pad_id, **kw})


@pytest.fixture
def saved(tmp_path) -> tuple[Path, CausalLM]:
    torch.manual_seed(0)
    model = CausalLM(_tiny_config())
    folder = tmp_path / "model"
    save_model(model, build_char_tokenizer(), folder)
    return folder, model


def _named(path: Path) -> str:
    return re.escape(str(path))


def _edit_config(folder: Path, **changes) -> Path:
    path = folder / "config.json"
    d = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    path.write_text(json.dumps(d))
    return path


# ---- errors -----------------------------------------------------------------------------------

def test_model_hidden_size_reads_the_folder_or_the_shipped_target(saved):
    from gambit.model.loader import model_hidden_size

    folder, model = saved
    assert model_hidden_size(folder) == model.config.hidden_size
    assert model_hidden_size("") == 192  # the shipped target
    with pytest.raises(FileNotFoundError):
        model_hidden_size(folder / "absent")


def test_an_unknown_bare_name_lists_the_known_ones():
    with pytest.raises(FileNotFoundError, match=r"llama3: model folder does not exist, nor a model name "
                                                r"\(known: smollm2\)"):
        load_model("llama3")


def test_missing_folder(tmp_path):
    folder = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=_named(folder)):
        load_model(folder)


def test_folder_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(FileNotFoundError, match=_named(f) + ": a file, not a model folder"):
        load_model(f)  # it said "model folder does not exist" of a file that is there


def test_missing_config(saved):
    folder, _ = saved
    (folder / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=_named(folder / "config.json")):
        load_model(folder)


def test_malformed_config_names_path_and_line(saved):
    folder, _ = saved
    path = folder / "config.json"
    path.write_text('{\n  "vocab_size": 100,\n  "hidden_size": 16\n  "oops": 1\n}\n')
    with pytest.raises(ValueError, match=_named(path) + r".*line 4") as e:
        load_model(folder)
    assert "malformed JSON" in str(e.value)


def test_config_not_an_object(saved):
    folder, _ = saved
    path = folder / "config.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match=_named(path) + ".*JSON object"):
        load_model(folder)


@pytest.mark.parametrize("changes,match", [
    ({"num_attention_heads": 0}, "num_attention_heads"),
    ({"num_attention_heads": 0, "head_dim": None, "num_key_value_heads": None}, "num_attention_heads"),
    ({"model_type": "mistral"}, "model_type"),
    ({"hidden_size": "16"}, "hidden_size"),
    ({"vocab_size": None}, "vocab_size"),  # missing required field
    ({"rope_parameters": {"rope_theta": 10000.0, "rope_type": "yarn", "factor": 2.0}}, "yarn"),
])
def test_bad_config_value(saved, changes, match):
    folder, _ = saved
    path = _edit_config(folder, **changes)
    with pytest.raises(ValueError, match=_named(path) + ".*" + match):
        load_model(folder)


def test_missing_tokenizer(saved):
    folder, _ = saved
    (folder / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=_named(folder / "tokenizer.json")):
        load_model(folder)


def test_malformed_tokenizer(saved):
    folder, _ = saved
    path = folder / "tokenizer.json"
    path.write_text('{"version": "1.0", "model": ')
    with pytest.raises(ValueError, match=_named(path) + ".*malformed tokenizer"):
        load_model(folder)


def test_no_safetensors(saved):
    folder, _ = saved
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=_named(folder) + ".*safetensors"):
        load_model(folder)


def test_unreadable_safetensors(saved):
    folder, _ = saved
    path = folder / "model.safetensors"
    path.write_bytes(b"\x00garbage" * 4)
    with pytest.raises(ValueError, match=_named(path)):
        load_model(folder)


def test_weight_shape_mismatch(saved):
    folder, _ = saved
    _edit_config(folder, intermediate_size=32)
    with pytest.raises(ValueError, match=_named(folder) + r".*mlp\.\w+_proj\.weight.*shape.*config\.json"):
        load_model(folder)


def test_missing_weights(saved):
    folder, _ = saved
    path = folder / "model.safetensors"
    state = load_file(str(path))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(path))
    with pytest.raises(ValueError, match=_named(folder) + r".*missing.*layers\.1\.mlp\.up_proj\.weight"):
        load_model(folder)


def test_untied_config_without_lm_head_is_missing_weights(tmp_path):
    folder = tmp_path / "tied"
    save_model(CausalLM(_tiny_config(tie_word_embeddings=True)), build_char_tokenizer(), folder)
    assert "lm_head.weight" not in load_file(str(folder / "model.safetensors"))
    _edit_config(folder, tie_word_embeddings=False)
    with pytest.raises(ValueError, match=r"missing.*lm_head\.weight"):
        load_model(folder)


def test_unexpected_weights(saved):
    folder, _ = saved
    path = folder / "model.safetensors"
    state = load_file(str(path))
    state["model.layers.7.extra.weight"] = torch.zeros(2)
    save_file(state, str(path))
    with pytest.raises(ValueError, match=r"unexpected.*model\.layers\.7\.extra\.weight"):
        load_model(folder)


def test_bad_dtype(saved):
    folder, _ = saved
    with pytest.raises(ValueError, match="dtype"):
        load_model(folder, dtype="float8")


# ---- save / load --------------------------------------------------------------------------------

@pytest.mark.parametrize("tied", [True, False])
def test_save_load_round_trip(tmp_path, tied):
    torch.manual_seed(1)
    model = CausalLM(_tiny_config(tie_word_embeddings=tied, attention_bias=True))
    folder = tmp_path / "m"
    save_model(model, build_char_tokenizer(), folder)
    loaded, tok = load_model(folder)
    want, got = model.state_dict(), loaded.state_dict()
    assert set(want) == set(got)
    for k in want:
        assert torch.equal(want[k], got[k]), k
    assert dataclasses.replace(loaded.config, extra={}) == model.config
    assert loaded.config.extra == {"architectures": ["LlamaForCausalLM"], "hidden_act": "silu"}
    assert not loaded.training
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    ids = torch.tensor([tok.encode("12+3=15")])
    with torch.no_grad():
        assert torch.equal(model.logits(model(ids)[0]), loaded.logits(loaded(ids)[0]))


def test_load_bfloat16_keeps_float_rope(saved):
    folder, _ = saved
    model, _ = load_model(folder, dtype="bf16")
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert model.rope.cos.dtype == torch.float32 and model.rope.sin.dtype == torch.float32


def test_save_over_existing_keeps_extra_files_and_no_temp_dirs(saved):
    folder, _ = saved
    (folder / "README.md").write_text("# model card\n")
    (folder / "training.json").write_text('{"steps": 1}')
    (folder / "evals").mkdir()
    (folder / "evals" / "dev.json").write_text("{}")
    # stale weights from an earlier (sharded) layout must not survive: load_model reads all *.safetensors
    save_file({"old.weight": torch.zeros(1)}, str(folder / "model-00001-of-00002.safetensors"))
    (folder / "model.safetensors.index.json").write_text("{}")
    torch.manual_seed(2)
    new = CausalLM(_tiny_config())
    save_model(new, build_char_tokenizer(), folder)
    assert (folder / "README.md").read_text() == "# model card\n"
    assert (folder / "training.json").read_text() == '{"steps": 1}'
    assert (folder / "evals" / "dev.json").read_text() == "{}"
    assert not (folder / "model-00001-of-00002.safetensors").exists()
    assert not (folder / "model.safetensors.index.json").exists()
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no .model.* temp/old dirs
    loaded, _ = load_model(folder)
    for k, v in new.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v)


def test_save_into_new_nested_folder(tmp_path):
    folder = tmp_path / "a" / "b" / "model"
    save_model(CausalLM(_tiny_config()), build_char_tokenizer(), folder)
    assert (folder / "config.json").is_file()
    assert [p.name for p in folder.parent.iterdir()] == ["model"]


# ---- tokenizer ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return build_char_tokenizer()


def test_boundary_is_one_token(tok):
    ids = tok.encode(BOUNDARY, add_bos=False)
    assert len(ids) == 1
    assert tok.boundary_ids == frozenset(ids)
    assert tok.decode(ids) == "\n\n"
    assert tok.encode("1\n\n2", add_bos=False) == [tok.encode("1", add_bos=False)[0], ids[0],
                                                    tok.encode("2", add_bos=False)[0]]
    assert len(tok.encode("\n\n\n", add_bos=False)) == 2
    assert len(tok.encode("\n", add_bos=False)) == 1


def test_special_ids(tok):
    assert (tok.pad_id, tok.bos_id, tok.eos_ids) == (0, 1, [2])
    assert tok.encode("7")[0] == tok.bos_id
    assert tok.encode("7", add_bos=False) == tok.encode("7")[1:]
    ids = tok.encode("7") + tok.eos_ids
    assert tok.decode(ids) == "7"
    assert tok.decode(ids, skip_special=False) == "<bos>7<eos>"
    assert tok.vocab_size == 100


def test_round_trip_generated_texts(tok):
    for split in SPLITS:
        for p in generate(split, 5, 0, TaskConfig(1, 16)):
            for text in (p.prompt, p.solution, p.prompt + p.solution):
                ids = tok.encode(text)
                assert ids[0] == tok.bos_id
                assert tok.decode(ids) == text
                assert len(ids) - 1 == len(text) - text.count("\n\n")  # one token per char, \n\n merged


def test_saved_tokenizer_file_round_trip(tok, tmp_path):
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    again = Tokenizer.from_file(path)
    assert (again.bos_id, again.eos_ids, again.pad_id) == (tok.bos_id, tok.eos_ids, tok.pad_id)
    assert again.boundary_ids == tok.boundary_ids
    text = generate("dev", 1, 3)[0].solution
    assert again.encode(text) == tok.encode(text)


def test_a_model_of_another_family_is_named_not_its_missing_fields(tmp_path):
    """A GPT-2 folder: its family is what is wrong, not the Llama fields it lacks."""
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "n_layer": 2, "n_embd": 64}')
    with pytest.raises(ValueError, match="model_type 'gpt2' is not a family this engine runs; one of llama"):
        load_model(tmp_path)


def test_load_tokenizer_reads_no_weights_and_takes_the_configs_special_ids(saved):
    """One way to load a model's tokenizer alone (run's kv-blocks check built it a third way)."""
    from gambit.model.loader import load_tokenizer
    from gambit.run import RunConfig, check_kv_blocks, problems_of

    folder, _ = saved
    _, full = load_model(folder)
    (folder / "model.safetensors").unlink()  # a check before the load reads no weights
    tok = load_tokenizer(folder)
    assert tok.encode("12+3=15\n\n") == full.encode("12+3=15\n\n") and tok.eos_ids == full.eos_ids
    _edit_config(folder, eos_token_id=[2, 5])
    assert load_tokenizer(folder).eos_ids == [2, 5]  # config.json's ids, as load_model takes them
    from gambit.paths import TARGET

    assert load_tokenizer("").vocab_size == Tokenizer.from_file(TARGET / "tokenizer.json").vocab_size
    cfg = RunConfig(model=str(folder), problems=1, save="", png="", kv_blocks=1)
    with pytest.raises(ValueError, match="--kv-blocks 1: too few"):
        check_kv_blocks(cfg, problems_of(cfg))
    with pytest.raises(FileNotFoundError, match="model folder does not exist"):
        load_tokenizer(folder / "absent")
