from hypothesis import given, settings
from hypothesis import strategies as st

from accel.text.stop_strings import StopStringMatcher


def _run(deltas, stop, include=False):
    m = StopStringMatcher(tuple(stop), include)
    out, hit = [], None
    for d in deltas:
        r = m.feed(d)
        out.append(r.text)
        if r.stop_str is not None:
            hit = r.stop_str
            break
    else:
        out.append(m.flush())
    return "".join(out), hit, out


def test_stop_string_across_deltas_is_trimmed():
    text, hit, parts = _run(["Hello wo", "rl", "d! more"], ["world"])
    assert text == "Hello " and hit == "world"
    # nothing of the stop string was emitted before it was known not to be a stop
    assert "wo" not in "".join(parts)


def test_include_stop_str_in_output():
    text, hit, _ = _run(["ab", "cEN", "Dxyz"], ["END"], include=True)
    assert text == "abcEND" and hit == "END"


def test_earliest_stop_wins():
    text, hit, _ = _run(["xx STOP yy HALT"], ["HALT", "STOP"])
    assert text == "xx " and hit == "STOP"


def test_no_stop_releases_everything():
    text, hit, _ = _run(["abc", "de"], ["zzz"])
    assert text == "abcde" and hit is None


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet="abcX", max_size=30),
    st.text(alphabet="abcX", min_size=1, max_size=4),
    st.lists(st.integers(1, 5), max_size=30),
    st.booleans(),
)
def test_matches_whole_text_search(text, stop, cuts, include):
    deltas, pos = [], 0
    for c in cuts:
        deltas.append(text[pos : pos + c])
        pos += c
    deltas.append(text[pos:])
    got, hit, _ = _run(deltas, [stop], include)
    idx = text.find(stop)
    if idx < 0:
        assert got == text and hit is None
    else:
        assert hit == stop
        assert got == text[: idx + (len(stop) if include else 0)]
