import pickle

import pytest

from accel.contract import EncodedImage, GenerateRequest, InvalidRequestError


def test_content_hash_is_the_bytes_identity():
    a, b = EncodedImage(b"\x89PNG one", "image/png"), EncodedImage(b"\x89PNG one", "image/png")
    assert a.content_hash == b.content_hash and len(a.content_hash) == 64
    assert EncodedImage(b"\x89PNG two", "image/png").content_hash != a.content_hash
    assert a.num_bytes == 8


def test_refusals_name_images():
    for data, mime in ((b"", "image/png"), (b"x", "audio/wav"), ("str", "image/png")):
        with pytest.raises(InvalidRequestError) as err:
            EncodedImage(data, mime)  # type: ignore[arg-type]
        assert err.value.field == "images"
    with pytest.raises(InvalidRequestError) as err:
        GenerateRequest("r", (1, 2), images=[EncodedImage(b"x", "image/png")])  # type: ignore[arg-type]
    assert err.value.field == "images"


def test_request_with_images_crosses_a_process_boundary():
    image = EncodedImage(b"\xff\xd8 jpeg bytes", "image/jpeg")
    req = GenerateRequest("r", (1, 2, 3), images=(image,))
    back = pickle.loads(pickle.dumps(req))
    assert back == req and back.images[0].content_hash == image.content_hash
