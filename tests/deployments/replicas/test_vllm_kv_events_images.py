"""The translator on image requests, with events made by vLLM's own ``BlockPool`` (its block
hasher, extra keys and ``BlockStored``), checked against the ingress's hashes of the same request
before the processor's expansion."""

import hashlib

import pytest

from accel.block_hash import ImageSlot, hash_image_anchor, hash_prompt_blocks, salted_root
from deployments.messages.kv_events import BlockRemoved
from deployments.replicas.vllm_kv_events import VLLMEventTranslator
from deployments.router.logic.precise_index import PrecisePrefixIndex

pytest.importorskip("vllm.distributed.kv_events")
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256_cbor  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402
from vllm.v1.core.block_pool import BlockPool  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

BS = 4
IMAGE = 7  # the placeholder token, as the chat template renders it
NUM_IMAGE_TOKENS = 7  # what the processor expands it to (tiny-idefics3: 7)
PRE, POST = list(range(100, 106)), list(range(200, 215))  # the image starts in block 1, at offset 2
A, B = (hashlib.sha256(data).hexdigest() for data in (b"png-a", b"png-b"))  # EncodedImage.content_hash


def vllm_events(pre, images, post, salt=None):
    """vLLM's BlockStored for a prompt of ``pre``, each image of ``images`` (content hashes)
    expanded to NUM_IMAGE_TOKENS placeholders, and ``post``: the engine's view of the request
    (each image named by its content hash, as our engine passes ``multi_modal_uuids``)."""
    kv_cache_utils.init_none_hash(sha256_cbor)
    tokens, features = list(pre), []
    for content_hash in images:
        features.append(
            MultiModalFeatureSpec(None, "image", content_hash, PlaceholderRange(len(tokens), NUM_IMAGE_TOKENS))
        )
        tokens += [IMAGE] * NUM_IMAGE_TOKENS
    tokens += post
    hasher = kv_cache_utils.get_request_block_hasher(BS, sha256_cbor)
    request = Request(
        "r", tokens, SamplingParams(max_tokens=1), None, mm_features=features, cache_salt=salt, block_hasher=hasher
    )
    pool = BlockPool(64, True, BS, enable_kv_cache_events=True)
    num_full = len(tokens) // BS
    pool.cache_full_blocks(request, pool.get_new_blocks(num_full), 0, num_full, BS, 0)
    return pool.take_events()


def ingress_hashes(pre, images, post, root=0):
    """The ingress's hashes: one placeholder per image, before the expansion."""
    tokens, slots = list(pre), []
    for content_hash in images:
        slots.append(ImageSlot(len(tokens), content_hash))
        tokens.append(IMAGE)
    return hash_prompt_blocks(tokens + post, BS, root, slots)


def translated(events, tr=None):
    out = (tr or VLLMEventTranslator(BS)).translate(events)
    return [h for event in out for h in event.block_hashes]


def test_an_image_requests_text_blocks_and_anchor_equal_the_ingress_hashes():
    ours = translated(vllm_events(PRE, [A], POST))
    assert ours == ingress_hashes(PRE, [A], POST)[:2]  # block 0 (text), block 1 (the anchor)
    assert ours[0] == hash_prompt_blocks(PRE, BS)[0]  # the text prefix is shared with text prompts
    assert ours[1] == hash_image_anchor(ours[0], PRE[4:], A)


def test_different_images_share_only_the_text_prefix_in_the_index():
    index = PrecisePrefixIndex()
    index.add_replica("r", 64)
    index.apply_events("r", VLLMEventTranslator(BS).translate(vllm_events(PRE, [A], POST)))
    same, other = ingress_hashes(PRE, [A], POST), ingress_hashes(PRE, [B], POST)
    assert index.match(same, {"r"}) == {"r": 2}
    assert index.match(other, {"r"}) == {"r": 1}
    assert not set(same[1:]) & set(other[1:])  # nothing in common from the image's block on
    assert index.match(hash_prompt_blocks(PRE + [IMAGE] + POST, BS), {"r"}) == {"r": 1}  # nor a text prompt


def test_blocks_past_the_anchor_are_skipped_and_removal_goes_through_the_table():
    events = vllm_events(PRE, [A], POST)
    num_blocks = len(events[0].block_hashes)
    tr = VLLMEventTranslator(BS)
    ours = translated(events, tr)
    assert tr.num_skipped_blocks == num_blocks - 2
    # vLLM chains the request's later blocks on a block past the anchor, or on the anchor itself:
    tail = events[0].token_ids[-BS:]
    assert tr.translate([_event([11], events[0].block_hashes[-1], tail)]) == []
    assert tr.translate([_event([12], events[0].block_hashes[1], tail)]) == []
    removed = tr.translate([_removed(events[0].block_hashes[:2])])
    assert removed == [BlockRemoved(tuple(ours))]


def test_salt_and_image_in_the_first_block():
    pre = PRE[:1]  # the image starts in block 0, whose keys are then (image, offset) and the salt
    root = salted_root("tenant")
    ours = translated(vllm_events(pre, [A], POST, salt="tenant"))
    assert ours == ingress_hashes(pre, [A], POST, root)[:1] == [hash_image_anchor(root, pre, A)]


def test_a_second_image_keys_the_block_it_is_in():
    """The ingress chains past the anchor with every image's hash: A then B and A then C share
    the text and A's anchor, nothing from the block holding the second image on."""
    ab, ac = ingress_hashes(PRE, [A, B], POST), ingress_hashes(PRE, [A, hashlib.sha256(b"c").hexdigest()], POST)
    assert ab[:2] == ac[:2] and not set(ab[2:]) & set(ac[2:])
    assert translated(vllm_events(PRE, [A, B], POST)) == ab[:2]


def _event(hashes, parent, tokens):
    from vllm.distributed.kv_events import BlockStored as VllmBlockStored

    return VllmBlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=BS,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )


def _removed(hashes):
    from vllm.distributed.kv_events import BlockRemoved as VllmBlockRemoved

    return VllmBlockRemoved(block_hashes=list(hashes), medium="GPU")


def test_removal_of_an_anchor_forgets_it():
    tr = VLLMEventTranslator(BS)
    events = vllm_events(PRE, [A], POST)
    ours = translated(events, tr)
    tr.translate([_removed(events[0].block_hashes[1:2])])
    assert translated(events, tr) == ours[1:]  # stored again: the anchor is news, block 0 still held
