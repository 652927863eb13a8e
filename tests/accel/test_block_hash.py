import os
import subprocess
import sys

from accel.block_hash import ROOT_HASH, hash_block, hash_prompt_blocks, salted_root


def test_chained_hashes_identify_prefixes():
    a = hash_prompt_blocks(list(range(40)), 16)
    b = hash_prompt_blocks(list(range(32)) + [99] * 8, 16)
    assert len(a) == 2 and a == b  # the partial third block has no hash
    c = hash_prompt_blocks([1] + list(range(1, 40)), 16)
    assert c[0] != a[0] and c[1] != a[1]  # a change in block 0 changes every later hash
    assert hash_block(ROOT_HASH, list(range(16))) == a[0]


def test_hash_is_stable_across_processes():
    code = "from accel.block_hash import hash_prompt_blocks; print(hash_prompt_blocks(list(range(64)), 16))"
    outs = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        outs.add(
            subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout
        )
    assert len(outs) == 1
    assert outs.pop().strip() == str(hash_prompt_blocks(list(range(64)), 16))


IDS = list(range(3, 3 + 96))


def test_salted_chains_are_disjoint_and_stable():
    plain = hash_prompt_blocks(IDS, 32)
    a, a2 = hash_prompt_blocks(IDS, 32, salted_root("a")), hash_prompt_blocks(IDS, 32, salted_root("a"))
    b = hash_prompt_blocks(IDS, 32, salted_root("b"))
    assert a == a2  # the same salt shares its prefix
    assert not (set(a) & set(plain)) and not (set(a) & set(b))
    assert salted_root(None) == salted_root("") == ROOT_HASH


def test_adapter_chains_are_disjoint_from_base_salt_and_each_other():
    roots = {
        "base": ROOT_HASH,
        "salt": salted_root("s"),
        "a": salted_root(None, "a"),
        "b": salted_root(None, "b"),
        "a+salt": salted_root("s", "a"),
        "a+other salt": salted_root("t", "a"),
        "ab split": salted_root("a", "b"),  # (salt, name) pairs do not collide by concatenation
        "ab joined": salted_root(None, "ab"),
    }
    chains = {k: set(hash_prompt_blocks(IDS, 32, root)) for k, root in roots.items()}
    for i, x in enumerate(chains):
        for y in list(chains)[i + 1 :]:
            assert not (chains[x] & chains[y]), (x, y)
    assert salted_root(None, "a") == salted_root("", "a")  # one root per adapter, stable
    assert salted_root("s", None) == salted_root("s")  # unchanged for salt-only requests


def test_adapter_root_is_stable_across_processes():
    code = "from accel.block_hash import salted_root; print(salted_root('s', 'tiny-llama-lora-a'))"
    env = dict(os.environ, PYTHONHASHSEED="7")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout
    assert out.strip() == str(salted_root("s", "tiny-llama-lora-a"))


def test_images_key_every_block_from_the_first_images_block_on():
    from accel.block_hash import ImageSlot, hash_image_anchor

    ids = list(range(100, 164))  # 4 blocks of 16; the image's placeholder at 20 (block 1)
    a, b = (
        hash_prompt_blocks(ids, 16, images=[ImageSlot(20, "a")]),
        hash_prompt_blocks(ids, 16, images=[ImageSlot(20, "b")]),
    )
    text = hash_prompt_blocks(ids, 16)
    assert len(a) == len(b) == len(text) == 4
    assert a[0] == b[0] == text[0]  # the text before the image's block is shared with every prompt
    assert not set(a[1:]) & set(b[1:]) and not set(a[1:]) & set(text)
    assert a == hash_prompt_blocks(ids, 16, images=[ImageSlot(20, "a")])  # the same image shares all
    assert a[1] == hash_image_anchor(a[0], ids[16:20], "a")
    # The anchor depends only on what precedes the image: the rest of its block may differ.
    later = hash_prompt_blocks(ids[:21] + [7] * 43, 16, images=[ImageSlot(20, "a")])
    assert later[:2] == a[:2] and later[2] != a[2]
    # An image at the start: no text block, the anchor on the root; ids ending inside the image's
    # block still get the anchor (the engine's expansion fills that block).
    assert hash_prompt_blocks([1, 2], 16, images=[ImageSlot(0, "a")]) == [hash_image_anchor(ROOT_HASH, [], "a")]


def test_image_hashes_are_stable_across_processes():
    code = (
        "from accel.block_hash import ImageSlot, hash_prompt_blocks; "
        "print(hash_prompt_blocks(list(range(64)), 16, 5, [ImageSlot(20, 'x'), ImageSlot(40, 'y')]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONHASHSEED="7"),
        check=True,
        capture_output=True,
        text=True,
    )
    from accel.block_hash import ImageSlot

    assert out.stdout.strip() == str(
        hash_prompt_blocks(list(range(64)), 16, 5, [ImageSlot(20, "x"), ImageSlot(40, "y")])
    )
