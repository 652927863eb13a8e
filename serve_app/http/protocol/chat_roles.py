"""OpenAI's ``developer`` role on chat templates that do not know it, as vLLM 0.32 renders it
(``vllm.renderers.hf.safe_apply_chat_template``): such messages become ``system`` messages and
every system message is merged into one at the front (some templates accept a system message
only there). A template that mentions "developer" gets the messages as sent. vLLM's own
functions do the work (private ones; vLLM is pinned to 0.32, and the tests compare with it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast


def developer_as_system(messages: Sequence[Mapping[str, Any]], chat_template: Any) -> list[dict[str, Any]]:
    """``chat_template``: the one the conversation is rendered with (the request's or the
    tokenizer's; a dict of named templates is searched as a whole)."""
    out = [dict(m) for m in messages]
    if not any(m.get("role") == "developer" for m in out):
        return out
    # vLLM is imported only here: an ingress without it (a TT-only install) serves every other request
    from vllm.renderers.hf import (
        _consolidate_system_messages,
        _convert_developer_to_system,
        _detect_developer_role_support,
    )

    template = "\n".join(map(str, chat_template.values())) if isinstance(chat_template, Mapping) else str(chat_template)
    if _detect_developer_role_support(template):
        return out
    return cast(list[dict[str, Any]], _consolidate_system_messages(_convert_developer_to_system(cast(Any, out))))
