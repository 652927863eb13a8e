import json

from accel.checkpoint import max_position_embeddings


def test_max_position_embeddings_from_config_json(tiny_llama, tmp_path):
    expected = json.loads((tiny_llama / "config.json").read_text())["max_position_embeddings"]
    assert max_position_embeddings(tiny_llama) == expected == max_position_embeddings(str(tiny_llama))
    assert max_position_embeddings(tmp_path) is None  # no config.json
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": "4096"}))
    assert max_position_embeddings(tmp_path) is None  # not an int
