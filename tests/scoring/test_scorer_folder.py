"""A scorer folder given as ``--scorer``: refused before anything starts when it cannot score the model
(another width, missing weights, a model folder, a config.json with a typo), in the loaders of `gambit
run` / `bench search`, in ``ServeConfig`` (before Ray) and in the Scorer deployment."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from gambit import paths
from gambit.scoring import random_scorer, save_scorer
from gambit.scoring.spec import check_scorer_spec, load_scorer_spec


@pytest.fixture
def wide(tmp_path):
    """A scorer of SmolLM2's width (576), not the shipped target's (192)."""
    s = random_scorer("mlp", 576)
    return str(save_scorer(s, s.config, tmp_path / "w576"))


def test_a_folder_of_another_width_is_refused_naming_the_flag_and_both_widths(wide):
    """Served, every call to it was refused and the run searched on scores of 0.5, silently."""
    with pytest.raises(ValueError, match=r"--scorer '.*w576'.* width 576, the model's hidden size is 192"):
        load_scorer_spec(wide, 192)
    with pytest.raises(ValueError, match="width 576, the model's hidden size is 192"):
        check_scorer_spec(wide, 192)
    assert load_scorer_spec(wide, 576).hidden_size == 576  # it fits that model
    assert load_scorer_spec(wide).hidden_size == 576  # width unknown: loaded as it is
    check_scorer_spec(wide)


def test_the_runtime_width_message_names_what_the_scorer_reads_and_what_came():
    with pytest.raises(ValueError, match=r"this scorer reads width 576 \(hidden_size 576\), but the rows "
                                         r"have width 192 \(the model's hidden size\)"):
        random_scorer("mlp", 576).score(["a"], torch.randn(1, 192))


def test_a_folder_without_weights_is_refused_by_the_check(tmp_path):
    (tmp_path / "nofile").mkdir()
    shutil.copy(paths.SCORER_MLP / "config.json", tmp_path / "nofile")
    with pytest.raises(ValueError, match="model.safetensors: scorer weights do not exist"):
        check_scorer_spec(str(tmp_path / "nofile"))


def test_serve_config_checks_a_folder_fully_before_ray_starts(tmp_path, wide):
    """`gambit serve --scorer FOLDER` printed a 40-line traceback from Serve after Ray had started."""
    from gambit.deployments.local import ServeConfig

    (tmp_path / "nofile").mkdir()
    shutil.copy(paths.SCORER_MLP / "config.json", tmp_path / "nofile")
    with pytest.raises(ValueError, match="model.safetensors: scorer weights do not exist"):
        ServeConfig(scorer=str(tmp_path / "nofile"))
    with pytest.raises(ValueError, match="width 576, the model's hidden size is 192"):
        ServeConfig(scorer=wide)  # the shipped target
    assert ServeConfig(scorer=str(paths.SCORER_MLP)).scorer == str(paths.SCORER_MLP)


def test_the_scorer_deployment_refuses_a_folder_of_another_width(wide):
    from gambit.deployments.scorer import Scorer

    with pytest.raises(ValueError, match="width 576, the model's hidden size is 192"):
        Scorer.func_or_class(scorer=wide, hidden_size=192, direct_host="")
    with pytest.raises(ValueError, match="width 576, the model's hidden size is 192"):
        Scorer.func_or_class(scorer=wide, direct_host="")  # the shipped target's width, from model ""


def _folder(tmp_path, config: dict) -> str:
    folder = tmp_path / "s"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    shutil.copy(paths.SCORER_MLP / "model.safetensors", folder)
    return str(folder)


def test_a_model_folder_is_refused_as_a_scorer(tmp_path):
    """A target's folder was read as an MLP scorer and failed on 57 unexpected tensor names."""
    folder = _folder(tmp_path, json.loads((paths.TARGET / "config.json").read_text()))
    with pytest.raises(ValueError, match=r"s is a model folder \(model_type llama.*not a scorer"):
        load_scorer_spec(folder)


def test_config_errors_name_the_file_and_unknown_keys(tmp_path):
    shipped = json.loads((paths.SCORER_MLP / "config.json").read_text())
    folder = _folder(tmp_path, {**shipped, "hidden_size": "192"})
    with pytest.raises(ValueError, match=r"s/config.json: hidden_size must be a positive integer, got '192'"):
        load_scorer_spec(folder)
    folder = _folder(tmp_path, {"kind": "mlp", "hidden_sise": 576})
    with pytest.raises(ValueError, match=r"s/config.json: unknown keys \['hidden_sise'\]"):
        load_scorer_spec(folder)
    folder = _folder(tmp_path, {**shipped, "kind": "gru"})
    with pytest.raises(ValueError, match="s/config.json: kind must be one of"):
        check_scorer_spec(folder)
    assert load_scorer_spec(_folder(tmp_path, shipped), 192).kind == "mlp"  # the shipped keys load


def test_a_folder_named_like_a_shipped_scorer_is_noted_not_read(tmp_path, monkeypatch, wide):
    """`--out mlp` then `--scorer mlp` gave the shipped scorer, silently."""
    shutil.copytree(wide, tmp_path / "mlp")
    monkeypatch.chdir(tmp_path)
    notes: list[str] = []
    assert load_scorer_spec("mlp", 192, note=notes.append).hidden_size == 192  # the shipped one
    assert len(notes) == 1 and "give ./mlp for it" in notes[0]
    assert load_scorer_spec("./mlp").hidden_size == 576
    load_scorer_spec("sequence", 192, note=notes.append)  # no folder of that name here: no note
    assert len(notes) == 1


def test_a_failed_deployment_is_said_with_its_replicas_reason():
    """A Scorer replica that failed to start surfaced as "Failed to update the deployments ['Scorer']"
    under a 40-line traceback; the reason is the last line of Serve's deployment message."""
    from types import SimpleNamespace as NS

    from gambit.deployments.local import deploy_failure

    message = ("The deployment failed to start 3 times in a row. ... Error:\nTraceback (most recent call "
               "last):\n  File \"scorer.py\", line 73, in __init__\nFileNotFoundError: s/model.safetensors: "
               "scorer weights do not exist\n")
    failed = NS(status=NS(name="DEPLOY_FAILED"), message=message)
    status = NS(applications={"scorer": NS(deployments={"Scorer": failed})})
    assert deploy_failure(status, "scorer") == ("the Scorer deployment failed: FileNotFoundError: "
                                                "s/model.safetensors: scorer weights do not exist")
    assert deploy_failure(status, "gambit") == ""
    failed.status = NS(name="HEALTHY")
    assert deploy_failure(status, "scorer") == ""
