"""The application on a simulated multi-node Ray cluster: a head node (Serve's controller and
proxy, the router, the ingress) and two fake Tenstorrent hosts (``TTNPU: 1`` each, no CPUs, so
nothing but engine replicas can land there; engines are the TT engine with the torch mesh model).

- engines run on the worker nodes, router and ingress on the head, and a request is answered
  token-exact (HF reference);
- prefill on one TT node, decode on the other: each node has its own shared-memory KV store
  (``MESHSERVE_KV_SHM_ROOT`` per node), so the decode replica pulls the prefill's KV from the
  other node (``deployments.kv.shm_remote``); the output is token-exact and nothing recomputed;
- a pool of two replicas puts one on each fake TT node;
- a node removed mid-stream: its streams end with an OpenAI error (or are retried), the other
  node's streams finish token-exact.

Runs in the default suite after everything else (``cluster``: its own Ray cluster).
"""

from __future__ import annotations

import shutil
import threading
import uuid
from pathlib import Path

import openai
import pytest

from tests.doubles.handle_loop import HANDLES, wait_until_router_knows
from tests.e2e.cluster import simulated_cluster
from tests.hf_reference import hf_greedy

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

PD_APP = "mn-pd"
TT_APP = "mn-tt"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    run = uuid.uuid4().hex[:8]
    roots = [Path(f"/dev/shm/meshserve-test-{run}-{n}") for n in ("a", "b")]
    nodes = [
        {
            "num_cpus": 0,
            "resources": {"TTNPU": 1, f"tt_{n}": 1},
            "env_vars": {"MESHSERVE_KV_SHM_ROOT": str(root)},
        }
        for n, root in zip("ab", roots)
    ]
    for root in roots:
        root.mkdir(parents=True, exist_ok=True)
    try:
        with simulated_cluster({"num_cpus": 2, "resources": {"head": 1}}, nodes) as (c, handles):
            from ray import serve

            port = _free_port()
            serve.start(http_options={"host": "127.0.0.1", "port": port, "location": "HeadOnly"})
            yield {"cluster": c, "nodes": handles, "url": f"http://127.0.0.1:{port}"}
    finally:
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tt_pool(name: str, role: str, replicas: int, resources: dict[str, float]) -> dict:
    return {
        "name": name,
        "engine": "tt",
        "accelerator": "cpu",
        "model": "tiny-llama",
        "role": role,
        "replicas": replicas,
        "resources": {"num_cpus": 0, "resources": resources},
        "engine_args": {"max_model_len": 512, "data_parallel_size": 1, "max_num_seqs": 4, "block_size": 16},
    }


def _deploy(app: str, pools: list[dict], tiny_llama, **extra) -> None:
    from ray import serve

    from serve_app.app import build_app

    args = {
        "config_file": f"test_multinode_{app}",
        "models": [{"name": "tiny-llama", "path": str(tiny_llama)}],
        "pools": pools,
        # A sliver of CPU: only the head has CPUs, so the router and the ingress land there.
        "router": {"num_cpus": 0.05},
        "ingress": {"num_cpus": 0.05},
        **extra,
    }
    serve.run(build_app(args), name=app, route_prefix=f"/{app}")
    wait_until_router_knows(app, len(pools) if pools[0]["replicas"] == 1 else pools[0]["replicas"], timeout_s=180)


def _replica_nodes(app: str) -> dict[str, list[str]]:
    """Deployment name -> node ids of its live replica actors (``ServeReplica:<app>:<name>``),
    from the GCS actor table (the state API needs the dashboard, which these clusters lack)."""
    from ray._private.state import actors

    out: dict[str, list[str]] = {}
    prefix = f"ServeReplica:{app}:"
    for a in actors().values():
        if a["State"] == "ALIVE" and a["ActorClassName"].startswith(prefix):
            out.setdefault(a["ActorClassName"].removeprefix(prefix), []).append(a["Address"]["NodeID"])
    return out


def _prompt(n: int, seed: int) -> list[int]:
    return [3 + (seed * 31 + i * 17) % 1000 for i in range(n)]


@pytest.fixture(scope="module")
def pd_app(cluster, tiny_llama):
    from ray import serve

    pools = [
        _tt_pool("prefill", "prefill", 1, {"TTNPU": 1, "tt_a": 1}),
        _tt_pool("decode", "decode", 1, {"TTNPU": 1, "tt_b": 1}),
    ]
    _deploy(PD_APP, pools, tiny_llama, pd={"threshold_tokens": 64})
    client = openai.OpenAI(base_url=f"{cluster['url']}/{PD_APP}/v1", api_key="unused", max_retries=0, timeout=120)
    try:
        yield client
    finally:
        serve.delete(PD_APP)
        from deployments.kv.connector_actor import kill_kv_connector

        kill_kv_connector(PD_APP)


def test_engines_on_workers_router_and_ingress_on_head(cluster, pd_app, tiny_llama):
    import ray

    head = ray.get_runtime_context().get_node_id()  # the driver runs on the head node
    prefill_node, decode_node = (n.node_id for n in cluster["nodes"])
    placed = _replica_nodes(PD_APP)
    engines = {k: v for k, v in placed.items() if k.startswith("TTMeshReplica-")}
    assert engines == {"TTMeshReplica-prefill": [prefill_node], "TTMeshReplica-decode": [decode_node]}, placed
    others = {k: v for k, v in placed.items() if k not in engines}
    assert len(others) >= 2 and all(node == head for nodes in others.values() for node in nodes), placed
    prompt = _prompt(20, 7)  # short: served whole by the decode pool
    out = pd_app.completions.create(
        model="tiny-llama",
        prompt=prompt,
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    assert out.choices[0].model_extra["token_ids"] == hf_greedy(tiny_llama, prompt, 8)


def test_cross_node_kv_handoff_is_token_exact(pd_app, tiny_llama):
    from deployments.kv.connector_actor import get_kv_connector

    prompt = _prompt(150, 1)
    stream = pd_app.completions.create(
        model="tiny-llama",
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    ids, usage = [], None
    for chunk in stream:
        usage = chunk.usage or usage
        ids += [t for c in chunk.choices for t in (c.model_extra.get("token_ids") or [])]
    assert ids == hf_greedy(tiny_llama, prompt, 12)
    stats = get_kv_connector(PD_APP).stats()
    assert stats["registry"]["recomputes"] == {}, stats  # the decode node imported the KV, never recomputed
    assert usage is not None and usage.prompt_tokens_details.cached_tokens >= 144, usage  # whole blocks imported


@pytest.fixture(scope="module")
def tt_app(cluster, pd_app, tiny_llama):
    """After the PD tests: one pool of two TT replicas (one per fake TT node)."""
    from ray import serve

    serve.delete(PD_APP)  # frees both TT nodes
    _deploy(TT_APP, [_tt_pool("tt", "both", 2, {"TTNPU": 1})], tiny_llama)
    client = openai.OpenAI(base_url=f"{cluster['url']}/{TT_APP}/v1", api_key="unused", max_retries=0, timeout=120)
    try:
        yield client
    finally:
        serve.delete(TT_APP)


def test_one_tt_replica_per_fake_tt_node(cluster, tt_app):
    placed = _replica_nodes(TT_APP)
    nodes = placed["TTMeshReplica-tt"]
    assert sorted(nodes) == sorted(n.node_id for n in cluster["nodes"]), placed


def test_node_removed_mid_stream(cluster, tt_app, tiny_llama):
    """Four long streams over both replicas; once each has its first tokens, one TT node goes
    away. Its streams end with an OpenAI error (or are retried elsewhere); none hangs; the other
    node's streams finish token-exact."""
    prompts = [_prompt(20, 100 + i) for i in range(4)]
    max_tokens = 400
    started = threading.Barrier(len(prompts) + 1, timeout=120)
    results: dict[int, object] = {}

    def run(i: int) -> None:
        ids: list[int] = []
        first = True
        try:
            stream = tt_app.completions.create(
                model="tiny-llama",
                prompt=prompts[i],
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True, "return_token_ids": True},
            )
            for chunk in stream:
                ids += [t for c in chunk.choices for t in (c.model_extra.get("token_ids") or [])]
                if first and ids:
                    first = False
                    started.wait()
            results[i] = ids
        except (openai.APIError, openai.APIConnectionError) as exc:
            results[i] = exc
        finally:
            if first:
                started.abort()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(prompts))]
    for t in threads:
        t.start()
    started.wait()
    # Both replicas have streams in flight (the router spreads by load) when the node goes.
    running = HANDLES.call(_running_per_replica())
    assert len(running) == 2 and all(n >= 1 for n in running), running
    cluster["cluster"].remove_node(cluster["nodes"][1], allow_graceful=False)
    for t in threads:
        t.join(timeout=180)
    assert not any(t.is_alive() for t in threads), "a stream hung after its node went away"
    done = {i: r for i, r in results.items() if isinstance(r, list)}
    failed = {i: r for i, r in results.items() if not isinstance(r, list)}
    assert len(done) + len(failed) == len(prompts)
    assert done, f"no stream survived: {failed}"
    for i, ids in done.items():  # finished ones (the surviving node's, or retried ones) are exact
        assert ids == hf_greedy(tiny_llama, prompts[i], max_tokens), i
    for exc in failed.values():
        assert isinstance(exc, openai.APIError | openai.APIConnectionError)


async def _running_per_replica() -> list[int]:
    from ray import serve

    handle = serve.get_deployment_handle("TTMeshReplica-tt", TT_APP)
    stats = await handle.broadcast("stats").results_async(timeout_s=30)
    return [s.num_running for s in stats]
