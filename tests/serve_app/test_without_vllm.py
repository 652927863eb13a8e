"""The ingress on a host without vLLM (base install + the ``tt`` extra: vLLM is an extra):
its modules import and a plain request converts and renders; vLLM is imported only by the
features that use its code (tool / reasoning parsers, logprob strings, the developer role)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys

    class BlockVllm:
        def find_spec(self, name, path=None, target=None):
            if name == "vllm" or name.startswith("vllm."):
                raise ImportError("no vllm on this host: " + name)

    sys.meta_path.insert(0, BlockVllm())
    import serve_app.http.openai_ingress  # noqa: F401
    from accel.text.tokenizer import load_tokenizer
    from serve_app.http.protocol import conversion as conv

    tok = load_tokenizer(sys.argv[1])
    req = conv.parse_request({"prompt": "hello", "stop": ["a", "b"], "max_tokens": 4}, False)
    (prompt,) = conv.request_prompts(req, tok, 512)
    chat = conv.parse_request({"messages": [{"role": "user", "content": "hi"}]}, True)
    assert conv.request_prompts(chat, tok, 512)[0]
    assert conv.sampling_params(req, len(prompt), 512).stop == ("a", "b")
    print("served without vllm")
    """
)


def test_the_ingress_serves_plain_requests_without_vllm(tiny_llama):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_llama)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "served without vllm" in out.stdout
