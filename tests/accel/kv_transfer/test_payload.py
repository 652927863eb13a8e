import pytest
import torch

from accel.block_hash import hash_block, hash_prompt_blocks
from accel.kv_transfer.payload import KVDescriptor, KVIntegrityError, KVModelMismatchError, KVPayload

PROMPT = list(range(3, 3 + 70))


def _payload(dtype=torch.float32, tokens=PROMPT, block_size=32):
    desc = KVDescriptor.for_prompt("fp-a", dtype, 4, 2, 32, tokens, block_size)
    kv = torch.randn(desc.shape).to(dtype)
    return KVPayload(desc, kv)


def test_descriptor_hashes_cover_the_partial_tail():
    desc = _payload().descriptor
    assert desc.num_tokens == 70 and len(desc.block_hashes) == 3  # 2 full blocks + tail of 6
    desc.check_prompt(PROMPT)
    desc.check_prompt(PROMPT + [9, 9])  # a longer prompt with the same head is fine
    with pytest.raises(KVIntegrityError):
        desc.check_prompt(PROMPT[:-1] + [999])
    with pytest.raises(KVIntegrityError):
        desc.check_prompt(PROMPT[:50])


def test_descriptor_hashes_are_the_shared_chained_block_hashes():
    # The prefix tier and the router key blocks by these: they must be accel.block_hash's, tail chained on.
    desc = _payload().descriptor
    full = tuple(hash_prompt_blocks(PROMPT, 32))
    assert len(full) == 2 and desc.block_hashes[:2] == full
    assert desc.block_hashes[2] == hash_block(full[1], PROMPT[64:])


def test_mismatched_model_is_refused_with_a_clear_error():
    desc = _payload().descriptor
    desc.check_compatible("fp-a", torch.float32, 4, 2, 32)
    with pytest.raises(KVModelMismatchError, match="computed by model fp-a.*serves model fp-b"):
        desc.check_compatible("fp-b", torch.float32, 4, 2, 32)
    with pytest.raises(KVModelMismatchError, match="kv_heads"):
        desc.check_compatible("fp-a", torch.float32, 4, 4, 32)
    with pytest.raises(KVModelMismatchError):
        desc.check_compatible("fp-a", torch.bfloat16, 4, 2, 32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_wire_round_trip_is_exact(dtype):
    payload = _payload(dtype)
    back = KVPayload.from_wire(payload.descriptor, payload.to_wire())
    assert back.kv.dtype == dtype and torch.equal(back.kv, payload.kv)
    assert payload.descriptor.num_bytes == payload.kv.numel() * payload.kv.element_size()


def test_payload_shape_must_match_descriptor():
    desc = _payload().descriptor
    with pytest.raises(ValueError, match="does not match"):
        KVPayload(desc, torch.zeros(4, 2, 69, 2, 32))


def test_head_takes_whole_blocks():
    payload = _payload()
    head = payload.head(64)
    assert head.descriptor.num_tokens == 64 and head.descriptor.block_hashes == payload.descriptor.block_hashes[:2]
    head.descriptor.check_prompt(PROMPT)
    assert torch.equal(head.kv, payload.kv[:, :, :64])
    with pytest.raises(ValueError):
        payload.head(40)
