"""The engine-requests stage: one engine request per (prompt, sample), each with its route and
its prompt's hashes (an adapter request: tests/serve_app/http/test_lora_requests.py)."""

from __future__ import annotations

from accel.contract import EncodedImage, SamplingParams
from accel.text.tokenizer import load_tokenizer
from deployments.config.load import load_app_config
from serve_app.http.pipeline.endpoints import COMPLETIONS
from serve_app.http.pipeline.engine_requests import engine_requests
from serve_app.http.pipeline.parse import Parsed, ResolvedModel
from serve_app.http.pipeline.prompt import Prompts


def _parsed(target: ResolvedModel, n: int) -> Parsed:
    read = COMPLETIONS.read({"model": "m", "prompt": ["a", "b"], "n": n, "seed": 3})
    return Parsed(read, target, None, "tt", "session-1", None)


def _target(tiny_llama) -> ResolvedModel:
    config = load_app_config(
        {
            "models": [{"name": "tiny-llama", "path": str(tiny_llama)}],
            "pools": [{"name": "tt", "engine": "tt", "accelerator": "cpu", "model": "tiny-llama", "replicas": 1}],
        },
        "t",
    )
    return ResolvedModel(config.models[0], load_tokenizer(str(tiny_llama)))


def test_one_engine_request_per_prompt_and_sample_each_with_its_route(tiny_llama):
    target = _target(tiny_llama)
    prompts = Prompts(((1, 2, 3), (4, 5)), {(1, 2, 3): (11,), (4, 5): (22,)})
    sampling = (SamplingParams(seed=3, max_tokens=4), SamplingParams(seed=3, max_tokens=5))
    planned = engine_requests(_parsed(target, 2), "cmpl", prompts, sampling)
    assert [g.prompt_token_ids for g in planned.generate] == [(1, 2, 3), (1, 2, 3), (4, 5), (4, 5)]
    assert [g.sampling.seed for g in planned.generate] == [3, 4, 3, 4]  # seed + sample index
    assert [g.sampling.max_tokens for g in planned.generate] == [4, 4, 5, 5]
    assert [r.request_id for r in planned.routes] == [g.request_id for g in planned.generate]
    assert [r.prompt_block_hashes for r in planned.routes] == [(11,), (11,), (22,), (22,)]
    routed = {(r.model, r.pool, r.session_id, r.lora) for r in planned.routes}
    assert routed == {("tiny-llama", "tt", "session-1", None)}
    assert all(g.lora is None and g.session_id == "session-1" for g in planned.generate)


def test_a_chats_images_go_on_every_choice_and_pin_its_routes_to_the_images_pool(tiny_llama):
    target = _target(tiny_llama)
    image = EncodedImage(b"\x89PNG...", "image/png")
    prompts = Prompts(((1, 2, 3),), {(1, 2, 3): (11,)}, (image,), "vl-pool")
    read = COMPLETIONS.read({"model": "m", "prompt": "a", "n": 2})
    parsed = Parsed(read, target, None, None, "session-1", None)  # (no pool pinned by the client)
    planned = engine_requests(parsed, "chatcmpl", prompts, (SamplingParams(max_tokens=4),))
    assert [g.images for g in planned.generate] == [(image,), (image,)]
    assert {r.pool for r in planned.routes} == {"vl-pool"}
