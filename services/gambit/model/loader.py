"""Load and save models in Hugging Face layout: config.json, *.safetensors, tokenizer.json."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from gambit.model.config import ModelConfig
from gambit.model.layers import RotaryEmbedding
from gambit.model.llama import CausalLM
from gambit.model.registry import resolve_model
from gambit.model.tokenizer import Tokenizer, write_tokenizer_config

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {sorted(DTYPES)}")
    return DTYPES[dtype]


INDEX = "model.safetensors.index.json"


def weight_files(folder: Path) -> list[Path]:
    """The shards ``model.safetensors.index.json`` names (a sharded checkpoint), else every
    ``*.safetensors``. Without reading the index a missing shard read as a list of missing tensors,
    and a stray file beside the shards (a consolidated copy) was loaded over them."""
    index = folder / INDEX
    if not index.is_file():
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            bins = " (pytorch_model*.bin is not read: save it with safetensors)" if any(
                folder.glob("pytorch_model*.bin")) else ""
            raise FileNotFoundError(f"{folder}: no *.safetensors weights in the model folder{bins}")
        return files
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (json.JSONDecodeError, AttributeError):
        weight_map = None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index}: not a safetensors index (a JSON object with a \"weight_map\")")
    files = [folder / name for name in sorted(set(weight_map.values()))]
    absent = [f for f in files if not f.is_file()]
    if absent:
        raise FileNotFoundError(f"{absent[0]}: a shard {INDEX} names is missing "
                                f"({len(absent)} of {len(files)} shards missing)")
    return files


def load_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    where: dict[str, Path] = {}
    for f in weight_files(folder):
        try:
            part = load_file(str(f))
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{f}: unreadable safetensors file: {e}") from None
        for k in part.keys() & where.keys():  # one silently replaced the other
            raise ValueError(f"{f}: tensor {k} is also in {where[k].name}")
        where.update(dict.fromkeys(part, f))
        state.update(part)
    return state


def model_folder(name_or_path: str | Path) -> Path:
    """The folder of a model path or fetched name, or FileNotFoundError naming it (and, for a bare
    name that is no folder, the names that are known: gambit models list)."""
    from gambit.model.registry import MODELS

    folder = resolve_model(name_or_path)
    if folder.exists() and not folder.is_dir():  # it said "model folder does not exist" of a file
        raise FileNotFoundError(f"{folder}: a file, not a model folder (a folder holding config.json, "
                                "tokenizer.json and *.safetensors)")
    if not folder.is_dir():
        known = "" if os.sep in str(folder) else f", nor a model name (known: {', '.join(sorted(MODELS))})"
        raise FileNotFoundError(f"{folder}: model folder does not exist{known}")
    return folder


def model_hidden_size(model: str | Path = "") -> int:
    """A target's hidden size from its config.json ("" = the shipped target): the width the Scorer
    reads, so a deployment names its model once."""
    from gambit.paths import TARGET

    return ModelConfig.from_file(model_folder(model or TARGET) / "config.json").hidden_size


def _json_object(path: Path) -> dict:
    """A side file's JSON object, or {} where it is absent (a malformed one is a clear error)."""
    if not path.is_file():
        return {}
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: malformed JSON at line {e.lineno}: {e.msg}") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path}: must hold a JSON object, got {type(d).__name__}")
    return d


def _tokenizer_of(folder: Path, config: ModelConfig) -> Tokenizer:
    """The folder's tokenizer.json with config.json's BOS and EOS ids (the file's own ``<bos>`` /
    ``<eos>`` are only a fallback: a real checkpoint's config names others). EOS ids also come from
    generation_config.json, as transformers' generate stops on them: Llama 3 Instruct's config.json
    names <|end_of_text|> only, its turns end in <|eot_id|>, so generation ran past the answer. BOS
    only where the tokenizer adds one (see ``post_processor_bos``). PAD as transformers reads it:
    tokenizer_config.json's pad_token, else config.json's pad_token_id (only a ``<pad>`` token or the
    first EOS was read: Qwen2.5 Instruct pads with <|endoftext|>, not its EOS <|im_end|>)."""
    eos = config.eos_ids
    gen = _json_object(folder / "generation_config.json").get("eos_token_id")
    for i in [gen] if isinstance(gen, int) else (gen if isinstance(gen, list) else []):
        if isinstance(i, int) and not isinstance(i, bool) and i not in eos:
            eos = [*eos, i]
    tok_config = _json_object(folder / "tokenizer_config.json")
    add_bos = tok_config.get("add_bos_token") is True
    pad = tok_config.get("pad_token")  # what transformers pads with: a token's text, or an AddedToken dict
    pad = pad.get("content") if isinstance(pad, dict) else pad
    tokenizer = Tokenizer.from_file(folder / "tokenizer.json", config.bos_token_id, eos, add_bos=add_bos)
    pad_id = tokenizer.tok.token_to_id(pad) if isinstance(pad, str) else None
    if pad_id is None and _in_vocab(config.pad_token_id, config):  # a -1 some old configs carry: unused
        pad_id = config.pad_token_id
    if pad_id is not None:
        tokenizer.pad_id = pad_id
    if tokenizer.bos_id is not None and not _in_vocab(tokenizer.bos_id, config):
        raise ValueError(f"{folder / 'config.json'}: bos_token_id {tokenizer.bos_id} is outside the "
                         f"vocabulary (0..{config.vocab_size - 1})")
    return tokenizer


def _in_vocab(i, config: ModelConfig) -> bool:
    return isinstance(i, int) and not isinstance(i, bool) and 0 <= i < config.vocab_size


def load_tokenizer(model: str | Path = "") -> Tokenizer:
    """A model's tokenizer alone, as ``load_model`` loads it (no weights read: a check before the load
    counts tokens with it); a folder or a fetched model's name ("" = the shipped target)."""
    from gambit.paths import TARGET

    folder = model_folder(model or TARGET)
    return _tokenizer_of(folder, ModelConfig.from_file(folder / "config.json"))


def load_model(folder: str | Path, device: str | torch.device = "cpu",
               dtype: str | torch.dtype = "float32") -> tuple[CausalLM, Tokenizer]:
    """Model (eval mode) and tokenizer from a Hugging Face folder (or a fetched model's name, see
    ``gambit.model.registry``), with errors naming the file."""
    folder = model_folder(folder)
    dtype = resolve_dtype(dtype)  # before reading gigabytes
    config = ModelConfig.from_file(folder / "config.json")
    tokenizer = _tokenizer_of(folder, config)
    state = load_state_dict(folder)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    with torch.device("meta"):  # no random init of weights the checkpoint replaces (54 s for 1B params)
        model = CausalLM(config)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(k for k in set(state) - set(expected) if "rotary_emb" not in k)
    if missing or unexpected:
        raise ValueError(f"{folder}: weights do not match config.json: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    for k, v in expected.items():
        if state[k].shape != v.shape:
            raise ValueError(f"{folder}: weight {k} has shape {tuple(state[k].shape)}, "
                             f"config.json implies {tuple(v.shape)}")
    model.load_state_dict({k: state[k] for k in expected}, strict=True, assign=True)
    model.rope = RotaryEmbedding(config)  # its tables are computed, not loaded
    model = model.to(device=device, dtype=dtype).eval()
    model.rope.cos, model.rope.sin = model.rope.cos.float(), model.rope.sin.float()
    return model, tokenizer


def _is_weights(name: str) -> bool:
    return name.endswith((".safetensors", ".safetensors.index.json"))


def umask() -> int:
    """The process's umask (read from /proc where it can be: setting it to read it races threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def readable(*paths: Path) -> None:
    """Modes as a plain mkdir / open would give (0777 / 0666 less the umask): ``mkdtemp`` makes 0700
    and safetensors' ``save_file`` 0600, so a model trained by one user was unreadable to the user
    that serves it (a container's, a shared cache's)."""
    mask = umask()
    for p in paths:
        os.chmod(p, (0o777 if Path(p).is_dir() else 0o666) & ~mask)


def save_model(model: CausalLM, tokenizer: Tokenizer, folder: str | Path) -> None:
    """Write atomically: a half-written folder never replaces a good one."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()
                 if not k.startswith("rope.")}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        readable(tmp, tmp / "model.safetensors")
        (tmp / "config.json").write_text(json.dumps(model.config.to_hf_dict(), indent=2))
        tokenizer.save(tmp / "tokenizer.json")
        write_tokenizer_config(tmp, tokenizer, model.config.max_position_embeddings)
        if folder.exists():
            for f in folder.iterdir():  # keep files we do not own (model card, eval JSON)
                if (tmp / f.name).exists() or _is_weights(f.name):  # stale shards would be loaded
                    continue
                if f.is_dir() and not f.is_symlink():
                    shutil.copytree(f, tmp / f.name, symlinks=True)
                else:
                    shutil.copy2(f, tmp / f.name, follow_symlinks=False)
            old = folder.with_name(f".{folder.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(folder, old)
            os.replace(tmp, folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
