import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from accel.kv_transfer.fingerprint import model_fingerprint


def test_same_folder_same_fingerprint(tiny_llama, tiny_qwen3):
    assert model_fingerprint(tiny_llama) == model_fingerprint(str(tiny_llama))
    assert model_fingerprint(tiny_llama) != model_fingerprint(tiny_qwen3)


def test_copy_has_the_same_fingerprint(tiny_llama, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_llama, copy)
    assert model_fingerprint(copy) == model_fingerprint(tiny_llama)


def test_other_weights_change_the_fingerprint(tiny_llama, tmp_path):
    copy = tmp_path / "reseeded"
    shutil.copytree(tiny_llama, copy)
    tensors = load_file(copy / "model.safetensors")
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1.0  # same header, different bytes
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    assert model_fingerprint(copy) != model_fingerprint(tiny_llama)


def test_config_change_changes_the_fingerprint(tiny_llama, tmp_path):
    copy = tmp_path / "cfg"
    shutil.copytree(tiny_llama, copy)
    config = json.loads((copy / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    (copy / "config.json").write_text(json.dumps(config, indent=4))
    assert model_fingerprint(copy) != model_fingerprint(tiny_llama)


def test_missing_config_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        model_fingerprint(tmp_path)
