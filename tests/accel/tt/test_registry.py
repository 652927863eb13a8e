"""Architecture registry: built-ins, torch implementations, EXTRA_MODELS_DIR bundles, refusals."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest

from accel.contract import ConfigError
from accel.tt.registry import ModelRegistry, build_registry, builtin_models, resolve_model_class, tt_arch_name
from accel.tt.torch_model import TorchMeshModel


def cfg(*archs: str) -> SimpleNamespace:
    return SimpleNamespace(architectures=list(archs))


def test_builtins_cover_the_tt_metal_families():
    BUILTIN_MODELS = builtin_models()
    names = {e.tt_arch for e in BUILTIN_MODELS}
    for arch in (
        "TTLlamaForCausalLM",
        "TTQwen2ForCausalLM",
        "TTQwen3ForCausalLM",
        "TTMistralForCausalLM",
        "TTGemma3ForConditionalGeneration",
        "TTDeepseekV3ForCausalLM",
        "TTGptOssForCausalLM",
        "TTQwen2_5_VLForConditionalGeneration",
        "TTMllamaForConditionalGeneration",
    ):
        assert arch in names
    assert all(e.ttnn_class and ":" in e.ttnn_class and e.ttnn_class.startswith("models.") for e in BUILTIN_MODELS)
    assert {e.tt_arch for e in BUILTIN_MODELS if e.torch_class} == {
        "TTLlamaForCausalLM",
        "TTQwen3ForCausalLM",
        "TTQwen2_5_VLForConditionalGeneration",
    }


def test_torch_backend_resolves_llama_and_qwen3():
    registry = build_registry(extra_models_dir="", include_builtins=True)
    assert resolve_model_class(cfg("LlamaForCausalLM"), "torch", registry) is TorchMeshModel
    assert resolve_model_class(cfg("Qwen3ForCausalLM"), "torch", registry) is TorchMeshModel
    assert (
        registry.resolve_entry(cfg("LlamaForCausalLM")).ttnn_class
        == "models.tt_transformers.tt.generator_vllm:LlamaForCausalLM"
    )


@pytest.mark.parametrize("arch", ["Gemma3ForConditionalGeneration", "DeepseekV3ForCausalLM", "Qwen2ForCausalLM"])
def test_other_families_refused_off_hardware(arch):
    registry = build_registry(extra_models_dir="", include_builtins=True)
    with pytest.raises(ConfigError, match=f"TT{arch} needs a Tenstorrent mesh"):
        resolve_model_class(cfg(arch), "torch", registry)


def test_ttnn_backend_without_tt_metal_says_which_class():
    registry = build_registry(extra_models_dir="", include_builtins=True)
    with pytest.raises(ConfigError, match="models.tt_transformers.tt.generator_vllm:LlamaForCausalLM"):
        resolve_model_class(cfg("LlamaForCausalLM"), "ttnn", registry)


def test_unknown_arch_and_backend():
    registry = build_registry(extra_models_dir="", include_builtins=True)
    with pytest.raises(ConfigError, match="TTBertModel"):
        registry.resolve(cfg("BertModel"), "torch")
    with pytest.raises(ConfigError, match="unknown mesh backend"):
        registry.resolve(cfg("LlamaForCausalLM"), "cuda")
    assert tt_arch_name("TTFoo") == "TTFoo" and tt_arch_name("Foo") == "TTFoo"


def _bundle(root, folder, arch, module, body, **meta):
    d = root / folder
    d.mkdir()
    (d / f"{module}.py").write_text(body)
    (d / "vllm_metadata.json").write_text(json.dumps({"arch": arch, "main_class": f"{module}:Model", **meta}))
    return d


def test_extra_models_dir_bundles(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    body = "class Model:\n    model_capabilities = {}\n"
    a = _bundle(tmp_path, "a", "MyNewForCausalLM", "my_new_model_a", body)
    _bundle(tmp_path, "b", "LlamaForCausalLM", "my_llama_b", body, backend="torch")
    (tmp_path / "not_a_bundle").mkdir()
    registry = build_registry(extra_models_dir=tmp_path, include_builtins=True)
    assert str(a) in sys.path
    cls = registry.resolve(cfg("MyNewForCausalLM"), "ttnn")
    assert cls.__module__ == "my_new_model_a"
    # A bundle registered first wins over the built-in of the same name.
    assert registry.resolve(cfg("LlamaForCausalLM"), "torch").__module__ == "my_llama_b"
    assert registry.get("TTLlamaForCausalLM").source == str(tmp_path / "b")


def test_builtins_off_keeps_only_user_models(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    _bundle(tmp_path, "a", "MyNewForCausalLM", "my_new_model_c", "class Model:\n    pass\n")
    registry = build_registry(extra_models_dir=tmp_path, include_builtins=False)
    assert registry.names() == ["TTMyNewForCausalLM"]
    with pytest.raises(ConfigError, match="no TT model registered"):
        registry.resolve(cfg("LlamaForCausalLM"), "torch")


def test_bad_bundles_are_warned_about_and_skipped(tmp_path, caplog):
    """vllm-tt-plugin: a malformed EXTRA_MODELS_DIR entry is skipped with a warning, not fatal."""
    d = tmp_path / "x"
    d.mkdir()
    (d / "vllm_metadata.json").write_text(json.dumps({"arch": "Foo"}))
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "vllm_metadata.json").write_text("{not json")
    _bundle(tmp_path, "z", "GoodForCausalLM", "good_model_z", "class Model:\n    pass\n")
    with caplog.at_level("WARNING", logger="accel.tt.registry"):
        registry = build_registry(extra_models_dir=tmp_path, include_builtins=False)
    assert registry.names() == ["TTGoodForCausalLM"]
    assert "main_class" in caplog.text and "cannot read" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="accel.tt.registry"):
        assert build_registry(extra_models_dir=tmp_path / "missing", include_builtins=False).names() == []
    assert "not a directory" in caplog.text


def _with_envs(monkeypatch, **values):
    import accel.envs

    monkeypatch.setattr(accel.envs, "ENVS", accel.envs.Envs(**{**vars(accel.envs.ENVS), **values}))


def test_generator_switches_and_gemma4_aliases(monkeypatch):
    from accel.tt.registry import folds_dp_into_lanes

    default = {e.tt_arch: e.ttnn_class for e in builtin_models()}
    assert default["TTLlamaForCausalLM"] == "models.tt_transformers.tt.generator_vllm:LlamaForCausalLM"
    for arch in ("TTGemma4ForCausalLM", "TTGemma4ForConditionalGeneration", "TTGemma4UnifiedForConditionalGeneration"):
        assert default[arch] == "models.demos.gemma4.tt.generator_vllm:Gemma4ForCausalLM"
    assert not folds_dp_into_lanes(type("LlamaForCausalLM", (), {}))
    assert folds_dp_into_lanes(type("GptOssForCausalLM", (), {}))
    assert folds_dp_into_lanes(TorchMeshModel)  # declares supports_data_parallel_lanes
    _with_envs(monkeypatch, tt_llama_text_ver="llama3_70b_galaxy", tt_qwen3_text_ver="qwen3_32b_galaxy")
    galaxy = {e.tt_arch: e.ttnn_class for e in builtin_models()}
    assert galaxy["TTLlamaForCausalLM"] == "models.demos.llama3_70b_galaxy.tt.generator_vllm:LlamaForCausalLM"
    assert galaxy["TTQwen3ForCausalLM"] == "models.demos.llama3_70b_galaxy.tt.generator_vllm:QwenForCausalLM"
    assert folds_dp_into_lanes(type("LlamaForCausalLM", (), {}))  # the Galaxy generator runs lanes
    _with_envs(monkeypatch, tt_llama_text_ver="llama4")
    with pytest.raises(ConfigError, match=r"TT_LLAMA_TEXT_VER='llama4': unsupported; pick one of \['tt_transformers'"):
        builtin_models()


def test_defaults_come_from_envs(monkeypatch):
    import accel.envs

    monkeypatch.setattr(
        accel.envs,
        "ENVS",
        accel.envs.Envs(**{**vars(accel.envs.ENVS), "extra_models_dir": None, "tt_builtin_models": False}),
    )
    assert build_registry().names() == []
    assert ModelRegistry().names() == []


def test_checkpoint_vision_traits_without_building_the_model(tiny_qwen25_vl, tiny_llama):
    from accel.tt.model_setup import load_hf_config
    from accel.tt.multimodal import TEXT_ONLY
    from accel.tt.registry import BACKEND_TORCH, BACKEND_TTNN, checkpoint_vision_traits

    registry = build_registry(extra_models_dir="", include_builtins=True)
    vl = load_hf_config(str(tiny_qwen25_vl))
    on_torch = checkpoint_vision_traits(vl, BACKEND_TORCH, registry)
    assert on_torch.is_multimodal and on_torch.uses_mrope and on_torch.mixes_text_and_image_rows
    on_ttnn = checkpoint_vision_traits(vl, BACKEND_TTNN, registry)  # tt-metal's class, by name
    assert on_ttnn.max_images_per_request == 1 and not on_ttnn.mixes_text_and_image_rows
    assert checkpoint_vision_traits(load_hf_config(str(tiny_llama)), BACKEND_TORCH, registry) == TEXT_ONLY
