import json

from accel.block_hash import ImageSlot
from accel.contract import EncodedImage
from serve_app.http.pipeline.image_slots import image_placeholder_id, image_slots

A, B = EncodedImage(b"a-bytes", "image/png"), EncodedImage(b"b-bytes", "image/png")


def test_each_image_sits_at_its_placeholder():
    assert image_slots([1, 2, 9, 3, 9], [A, B], 9) == (ImageSlot(2, A.content_hash), ImageSlot(4, B.content_hash))


def test_unlocated_images_sit_at_the_start():
    # one placeholder for two images (a template rendering something else), or no placeholder id
    assert image_slots([1, 9, 3], [A, B], 9) == (ImageSlot(0, A.content_hash), ImageSlot(0, B.content_hash))
    assert image_slots([1, 9, 3], [A], None) == (ImageSlot(0, A.content_hash),)
    assert image_slots([1, 2], [], 9) == ()


def test_placeholder_id_from_the_checkpoint_config(tmp_path):
    for name, config, want in [
        ("new", {"image_token_id": 4}, 4),
        ("old", {"image_token_index": 32000}, 32000),
        ("text", {"vocab_size": 10}, None),
    ]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        assert image_placeholder_id(tmp_path / name) == want
    assert image_placeholder_id(tmp_path / "missing") is None
