"""What the TT engine refuses before a request reaches its step thread (``check_request``), each
refusal naming its field. The engine-level test is test_engine_failures.py."""

from __future__ import annotations

import pytest

from accel.contract import GenerateRequest, InvalidRequestError, KVTransferParams, SamplingParams, StructuredOutputSpec
from accel.tt.request_checks import check_request

WS_SPEC = StructuredOutputSpec(regex="a+", whitespace_pattern=" ")
LIMITS = dict(vocab_size=100, max_model_len=16, can_transfer_kv=False)


def _field(request: GenerateRequest, **limits) -> str | None:
    try:
        check_request(request, **{**LIMITS, **limits})
    except InvalidRequestError as exc:
        return exc.field
    return None


@pytest.mark.parametrize(
    "request_, field",
    [
        (GenerateRequest("ok", (1, 2, 3)), None),
        (GenerateRequest("long", tuple(range(16))), "prompt"),
        (GenerateRequest("vocab", (1, 100)), "prompt"),
        (GenerateRequest("plp", (1,), SamplingParams(prompt_logprobs=0)), "prompt_logprobs"),
        (GenerateRequest("ws", (1,), SamplingParams(structured_outputs=WS_SPEC)), "structured_outputs"),
        (GenerateRequest("allow", (1,), SamplingParams(allowed_token_ids=[5, 100])), "allowed_token_ids"),
        (GenerateRequest("allow-ok", (1,), SamplingParams(allowed_token_ids=[5, 99])), None),
        (GenerateRequest("kv", (1,), kv_transfer=KVTransferParams(do_remote_decode=True)), "kv_transfer_params"),
    ],
    ids=lambda v: v.request_id if isinstance(v, GenerateRequest) else None,
)
def test_refusals_name_their_field(request_, field):
    assert _field(request_) == field


def test_kv_transfer_passes_with_hooks():
    request = GenerateRequest("kv", (1,), kv_transfer=KVTransferParams(do_remote_decode=True))
    assert _field(request, can_transfer_kv=True) is None


def test_images_are_refused_by_a_text_class_and_over_the_class_limit():
    from accel.tt.multimodal import TEXT_ONLY, VisionTraits
    from accel.tt.request_checks import check_images

    one_image = VisionTraits(is_multimodal=True, uses_mrope=True, max_images_per_request=1)
    request = GenerateRequest("r", (1, 2, 3))
    check_images(request, (), TEXT_ONLY, "m")  # text requests: nothing to check
    check_images(request, ("img",), one_image, "m")
    with pytest.raises(InvalidRequestError, match="not a multimodal model") as err:
        check_images(request, ("img",), TEXT_ONLY, "m")
    assert err.value.field == "images"
    with pytest.raises(InvalidRequestError, match="at most 1 image"):
        check_images(request, ("a", "b"), one_image, "m")
    exporting = GenerateRequest("r", (1, 2, 3), kv_transfer=KVTransferParams(do_remote_decode=True))
    with pytest.raises(InvalidRequestError) as err:
        check_images(exporting, ("img",), one_image, "m")
    assert err.value.field == "kv_transfer_params"
