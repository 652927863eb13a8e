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
