from accel.contract import FinishReason, GenerateRequest, SamplingParams
from accel.envs import ENVS
from accel.models.tiny import ensure_checkpoints
from accel.text.output_builder import OutputBuilder
from accel.text.stop_tokens import check_token_stop
from accel.text.tokenizer import load_tokenizer

ensure_checkpoints(ENVS.checkpoint_dir)
TOK = load_tokenizer(ENVS.checkpoint_dir / "tiny-llama")
EOS = next(iter(TOK.eos_token_ids))


def _builder(sampling, prompt=(0, 5, 6), max_model_len=64):
    req = GenerateRequest("r", prompt, sampling)
    return OutputBuilder(req, TOK.fast, TOK.eos_token_ids, max_model_len)


def _feed_one_by_one(builder, ids):
    deltas = []
    for t in ids:
        deltas.append(builder.add_tokens([t]))
        if deltas[-1].finished:
            break
    return deltas


def test_stop_string_spanning_tokens_is_found_and_trimmed():
    ids = TOK.encode("say hello world and more", add_special_tokens=False)
    b = _builder(SamplingParams(stop=["lo wor"], max_tokens=100))
    deltas = _feed_one_by_one(b, ids)
    assert "".join(d.text for d in deltas) == "say hel"
    assert deltas[-1].finish_reason is FinishReason.STOP and deltas[-1].stop_reason == "lo wor"


def test_eos_stops_and_counts_but_is_not_text():
    ids = TOK.encode("abc", add_special_tokens=False) + [EOS] + [50, 51]
    b = _builder(SamplingParams(max_tokens=100))
    deltas = _feed_one_by_one(b, ids)
    assert deltas[-1].finish_reason is FinishReason.STOP and deltas[-1].stop_reason is None
    assert deltas[-1].num_completion_tokens == len(ids) - 2
    assert "".join(d.text for d in deltas) == "abc"


def test_ignore_eos_and_min_tokens():
    b = _builder(SamplingParams(max_tokens=3, ignore_eos=True))
    deltas = _feed_one_by_one(b, [EOS, EOS, EOS, EOS])
    assert len(deltas) == 3 and deltas[-1].finish_reason is FinishReason.LENGTH
    b = _builder(SamplingParams(max_tokens=10, min_tokens=2, stop_token_ids=[40]))
    deltas = _feed_one_by_one(b, [40, EOS, 40, 41])
    assert len(deltas) == 3 and deltas[-1].stop_reason == 40


def test_max_model_len_finishes_with_length():
    b = _builder(SamplingParams(max_tokens=None), prompt=tuple(range(10)), max_model_len=12)
    deltas = _feed_one_by_one(b, [50, 51, 52, 53])
    assert len(deltas) == 2 and deltas[-1].finish_reason is FinishReason.LENGTH


def test_abort_releases_held_text():
    b = _builder(SamplingParams(stop=["zzzz"], max_tokens=100))
    d = b.add_tokens(TOK.encode("hello", add_special_tokens=False))
    final = b.finish(FinishReason.ABORT)
    assert d.text + final.text == "hello" and final.finish_reason is FinishReason.ABORT


def test_check_token_stop_min_tokens_blocks_eos():
    sp = SamplingParams(min_tokens=3, max_tokens=10)
    assert check_token_stop(EOS, 2, 5, sp, TOK.eos_token_ids, 100) is None
    assert check_token_stop(EOS, 4, 5, sp, TOK.eos_token_ids, 100).finish_reason is FinishReason.STOP


def test_stop_token_text_is_left_out_even_with_special_tokens_kept():
    """vLLM leaves an eos / stop token id's text out unless include_stop_str_in_output, also
    when special tokens are kept (a tool parser's request sets skip_special_tokens=False)."""
    ids = TOK.encode("abc", add_special_tokens=False) + [EOS]
    kept = _feed_one_by_one(_builder(SamplingParams(max_tokens=100, skip_special_tokens=False)), ids)
    assert "".join(d.text for d in kept) == "abc" and kept[-1].finish_reason is FinishReason.STOP
    assert kept[-1].num_completion_tokens == len(ids)
    sp = SamplingParams(max_tokens=100, skip_special_tokens=False, include_stop_str_in_output=True)
    assert "".join(d.text for d in _feed_one_by_one(_builder(sp), ids)) == "abc</s>"
    stop_id = ids[1]
    sp = SamplingParams(max_tokens=100, skip_special_tokens=False, stop_token_ids=[stop_id])
    deltas = _feed_one_by_one(_builder(sp), ids)
    assert "".join(d.text for d in deltas) == TOK.decode(ids[:1]) and deltas[-1].stop_reason == stop_id
