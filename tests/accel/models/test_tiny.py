import hashlib
import json
import subprocess
import sys
from pathlib import Path


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_two_runs_are_byte_identical(tmp_path):
    for name in ("a", "b"):
        subprocess.run(
            [sys.executable, "-m", "accel.models.tiny", str(tmp_path / name)], check=True, capture_output=True
        )
    a, b = _digests(tmp_path / "a"), _digests(tmp_path / "b")
    assert a == b
    for model in ("tiny-llama", "tiny-qwen3"):
        for f in (
            "config.json",
            "model.safetensors",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
        ):
            assert f"{model}/{f}" in a


def test_checkpoint_shapes(tiny_llama, tiny_qwen3):
    llama = json.loads((tiny_llama / "config.json").read_text())
    assert llama["architectures"] == ["LlamaForCausalLM"]
    assert llama["head_dim"] == 32 and llama["num_key_value_heads"] < llama["num_attention_heads"]
    assert llama["rope_parameters"]["rope_type"] == "llama3"
    qwen = json.loads((tiny_qwen3 / "config.json").read_text())
    assert qwen["architectures"] == ["Qwen3ForCausalLM"] and qwen["tie_word_embeddings"] is True


def test_tokenizer_and_chat_template(tiny_llama):
    from accel.text.tokenizer import load_tokenizer

    tok = load_tokenizer(tiny_llama)
    ids = tok.encode("Hello, wörld!")
    assert ids[0] == tok.hf.bos_token_id
    assert tok.decode(ids) == "Hello, wörld!"
    assert tok.eos_token_ids == frozenset({tok.hf.eos_token_id})
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    text = tok.decode(chat, skip_special_tokens=False)
    assert text.startswith("<s><|im_start|>user\nhi<|im_end|>") and text.endswith("<|im_start|>assistant\n")


def test_hf_loads_and_generates(tiny_llama):
    from tests.hf_reference import hf_greedy

    out = hf_greedy(tiny_llama, [0, 100, 200, 300], 8)
    assert len(out) == 8 and all(0 <= t < 1024 for t in out)
    assert hf_greedy(tiny_llama, [0, 100, 200, 300], 8) == out
