"""Our incremental detokenizer against vLLM 0.32's own (``vllm.v1.engine.detokenizer``, built
from an ``EngineCoreRequest`` with vLLM's tokenizer of the same checkpoint): the same text for
any prompt, output tokens (partial UTF-8 bytes and special tokens included) and chunking."""

from hypothesis import given, settings
from hypothesis import strategies as st
from vllm import SamplingParams as VllmSamplingParams
from vllm.tokenizers import get_tokenizer
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.engine.detokenizer import IncrementalDetokenizer as VllmDetokenizer

from accel.envs import ENVS
from accel.models.tiny import ensure_checkpoints
from accel.text.detokenizer import IncrementalDetokenizer
from accel.text.tokenizer import load_tokenizer

ensure_checkpoints(ENVS.checkpoint_dir)
TOK = load_tokenizer(ENVS.checkpoint_dir / "tiny-llama")
VLLM_TOK = get_tokenizer(str(ENVS.checkpoint_dir / "tiny-llama"))
VOCAB = TOK.vocab_size
ids_st = st.lists(st.integers(0, VOCAB - 1), max_size=60)


def _ours(prompt, ids, chunks, skip_special=True):
    detok = IncrementalDetokenizer(TOK.fast, skip_special, prompt)
    parts, pos = [], 0
    for size in chunks:
        parts.append(detok.step(ids[pos : pos + size]))
        pos += size
    parts.append(detok.step(ids[pos:]))
    return parts


def _vllm(prompt, ids, skip_special=True):
    sampling = VllmSamplingParams(max_tokens=max(1, len(ids)), skip_special_tokens=skip_special)
    request = EngineCoreRequest("r", list(prompt), None, sampling, None, 0.0, None, None, None)
    detok = VllmDetokenizer.from_new_request(VLLM_TOK, request)
    for token_id in ids:
        detok.update([token_id], False)
    return detok.output_text


@settings(max_examples=300, deadline=None)
@given(ids_st, ids_st, st.lists(st.integers(0, 4), max_size=20), st.booleans())
def test_text_equals_vllms_detokenizer(prompt, ids, chunks, skip_special):
    assert "".join(_ours(prompt, ids, chunks, skip_special)) == _vllm(prompt, ids, skip_special)


def test_a_trailing_incomplete_character_is_never_emitted():
    # Token 100 is a lone byte of a multi-byte character: vLLM's text ends without it (no
    # U+FFFD at the finish), and an invalid sequence followed by text comes out replaced.
    assert "".join(_ours([0], [100, 100], [])) == _vllm([0], [100, 100]) == ""
    text = "".join(_ours([0], [100, 100, 100, 44, 318], [1] * 5))
    assert text == _vllm([0], [100, 100, 100, 44, 318]) and text.endswith("Hel") and "\ufffd" in text


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_never_emits_broken_utf8_for_valid_text(text):
    # Text that encodes to valid UTF-8: no emitted delta may contain a replacement character.
    ids = TOK.encode(text, add_special_tokens=False)
    parts = _ours([], ids, [1] * len(ids), skip_special=False)
    assert "".join(parts) == text
    assert all("\ufffd" not in p for p in parts)


def test_multibyte_character_is_held_until_complete():
    text = "😀"
    ids = TOK.encode(text, add_special_tokens=False)
    assert len(ids) > 1  # the emoji spans several byte-level tokens
    detok = IncrementalDetokenizer(TOK.fast)
    deltas = [detok.step([i]) for i in ids]
    assert deltas[:-1] == [""] * (len(ids) - 1) and deltas[-1] == text


def test_a_character_split_between_prompt_and_output_decodes_in_the_prompts_context():
    ids = TOK.encode("😀", add_special_tokens=False)
    prompt, output = [0, *ids[:1]], ids[1:]
    assert "".join(_ours(prompt, output, [1] * len(output))) == _vllm(prompt, output)
