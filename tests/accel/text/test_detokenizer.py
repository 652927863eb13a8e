from hypothesis import given, settings
from hypothesis import strategies as st

from accel.envs import ENVS
from accel.models.tiny import ensure_checkpoints
from accel.text.detokenizer import IncrementalDetokenizer
from accel.text.tokenizer import load_tokenizer

ensure_checkpoints(ENVS.checkpoint_dir)
TOK = load_tokenizer(ENVS.checkpoint_dir / "tiny-llama")
VOCAB = TOK.vocab_size


def _stream(ids, chunks, skip_special=True):
    detok = IncrementalDetokenizer(TOK.fast, skip_special)
    parts, pos = [], 0
    for size in chunks:
        parts.append(detok.step(ids[pos : pos + size]))
        pos += size
    parts.append(detok.step(ids[pos:]))
    parts.append(detok.flush())
    return parts


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, VOCAB - 1), max_size=60), st.lists(st.integers(0, 4), max_size=20), st.booleans())
def test_incremental_equals_full_decode(ids, chunks, skip_special):
    parts = _stream(ids, chunks, skip_special)
    assert "".join(parts) == TOK.decode(ids, skip_special_tokens=skip_special)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_never_emits_broken_utf8_for_valid_text(text):
    # Text that encodes to valid UTF-8: no emitted delta may contain a replacement character.
    ids = TOK.encode(text, add_special_tokens=False)
    parts = _stream(ids, [1] * len(ids), skip_special=False)
    assert "".join(parts) == text
    assert all("\ufffd" not in p for p in parts)


def test_multibyte_character_is_held_until_complete():
    text = "😀"
    ids = TOK.encode(text, add_special_tokens=False)
    assert len(ids) > 1  # the emoji spans several byte-level tokens
    detok = IncrementalDetokenizer(TOK.fast)
    deltas = [detok.step([i]) for i in ids]
    assert deltas[:-1] == [""] * (len(ids) - 1) and deltas[-1] == text
