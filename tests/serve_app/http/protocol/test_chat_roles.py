"""The ``developer`` role as vLLM 0.32 renders it: a system message on templates without it."""

from __future__ import annotations

from serve_app.http.protocol import conversion as conv
from serve_app.http.protocol.chat_roles import developer_as_system


def _prompt(tok, messages, **kw):
    return conv.chat_prompt(conv.parse_request({"messages": messages, **kw}, True), tok)


def test_developer_renders_as_system_on_a_template_without_it(tok):
    assert "developer" not in tok.hf.chat_template
    user = {"role": "user", "content": "Hi"}
    as_developer = _prompt(tok, [{"role": "developer", "content": "Be nice"}, user])
    assert as_developer == _prompt(tok, [{"role": "system", "content": "Be nice"}, user])
    assert "developer" not in tok.decode(as_developer, skip_special_tokens=False)


def test_system_messages_are_merged_in_front(tok):
    messages = [
        {"role": "system", "content": "A"},
        {"role": "user", "content": "Hi"},
        {"role": "developer", "content": "B"},
    ]
    merged = [{"role": "system", "content": "A\n\nB"}, {"role": "user", "content": "Hi"}]
    assert developer_as_system(messages, tok.hf.chat_template) == merged
    assert _prompt(tok, messages) == _prompt(tok, merged)


def test_a_template_that_knows_developer_gets_it_as_sent():
    messages = [{"role": "developer", "content": "B", "tools": None}, {"role": "user", "content": "Hi"}]
    template = "{% for m in messages %}{% if m.role == 'developer' %}D{% endif %}{% endfor %}"
    assert developer_as_system(messages, template) == messages
    assert developer_as_system(messages, {"default": template}) == messages
