import hashlib
import json

from accel.models.tiny_lora import ADAPTERS, RANK, write_adapter


def test_adapters_are_seeded_peft_folders_byte_identical_across_runs(tiny_llama, tmp_path):
    digests = []
    for run in ("a", "b"):
        path = write_adapter(ADAPTERS[0], tiny_llama, tmp_path / run)
        digests.append({f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())})
    assert digests[0] == digests[1]
    assert set(digests[0]) == {"adapter_config.json", "adapter_model.safetensors"}
    config = json.loads((tmp_path / "a" / ADAPTERS[0].name / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["base_model_name_or_path"]) == ("LORA", RANK, "tiny-llama")


def test_the_two_adapters_differ(tiny_lora_adapters):
    a, b = ((p / "adapter_model.safetensors").read_bytes() for p in tiny_lora_adapters)
    assert a != b
