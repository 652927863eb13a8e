"""Issue 39's acceptance through the real ``serve run`` CLI on the ttnn stub: two applications, each
a TT pool on a simulated T3K (``TTNPU`` on the test's own Ray cluster, ``accelerator: tt``,
``MESH_DEVICE=T3K``, the stub simulating 8 chips from ``TTNN_STUB_SIMULATE``) whose model class is
a tt-metal contract double registered through the application's ``runtime_env``
``EXTRA_MODELS_DIR``:

- the version-1 generator (``tests/doubles/tt_metal_contract/v1``: keyword-only required
  commands, ``reset_batch`` rejected, inputs resident only as commanded) serves greedy == HF, one
  request sampled on the device and one on the host (``logprobs``); every decode it received (its
  JSONL call log, ``$MESHSERVE_TEST_TT_CALL_LOG``) carries the commands the contract's transition
  table gives for that step (first decode after a prefill, steady device, page-table-only refresh
  at a block boundary, steady host), never ``reload_inputs`` with ``reload_page_table``, never
  ``reset_sampling_state`` without ``reload_inputs``, and ``slot_remap`` on every decode;
- the version-0 generator (``tests/doubles/tt_metal_contract``) on the same requests: greedy ==
  HF, ``reset_batch`` on device-sampling decodes (true after a prefill, false in steady state)
  and no command or ``slot_remap``.

Kept short on a 2-core machine: two short requests per application, one after the other.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.conftest import REPO_ROOT, free_port
from tests.e2e.cluster import simulated_cluster
from tests.hf_reference import hf_greedy

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(1200)]

DOUBLES = REPO_ROOT / "tests" / "doubles"
APPS = {"v1": DOUBLES / "tt_metal_contract" / "v1", "v0": DOUBLES / "tt_metal_contract"}
CLASSES = {"v1": "HFContractGeneratorV1", "v0": "HFContractGenerator"}
COMMANDS = ("reload_inputs", "reload_page_table", "reload_sampling_params", "reset_sampling_state")
START_TIMEOUT_S = 600


def _app(name: str, tiny_llama: Path) -> dict:
    return {
        "name": f"contract-{name}",
        "route_prefix": f"/{name}",
        "import_path": "serve_app.app:build_app",
        "runtime_env": {"env_vars": {"EXTRA_MODELS_DIR": str(APPS[name])}},
        "args": {
            "config_file": f"test_tt_decode_contract_serve_{name}",
            "models": [{"name": "tiny-llama", "path": str(tiny_llama)}],
            "pools": [
                {
                    "name": "t3k",
                    "engine": "tt",
                    "accelerator": "tt",
                    "tt": {"mesh_device": "T3K"},
                    "model": "tiny-llama",
                    "replicas": 1,
                    "resources": {"num_cpus": 0},
                    "engine_args": {
                        "max_model_len": 256,
                        "max_num_seqs": 4,
                        "block_size": 16,
                        "max_num_batched_tokens": 256,
                        "enable_prefix_caching": True,
                        "async_scheduling": True,
                        "additional_config": {
                            "tt": {"sample_on_device_mode": "all", "trace_mode": "all", "enable_model_warmup": True}
                        },
                    },
                }
            ],
            "router": {"num_cpus": 0},
            "ingress": {"replicas": 1, "num_cpus": 0},
        },
    }


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_llama):
    tmp = tmp_path_factory.mktemp("tt_contract")
    log, port = tmp / "calls.jsonl", free_port()
    config = tmp / "serve.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "proxy_location": "HeadOnly",
                "http_options": {"host": "127.0.0.1", "port": port},
                "applications": [_app(name, tiny_llama) for name in APPS],
            }
        )
    )
    # The raylets (and so every worker) inherit these: the ttnn stub importable and simulating a
    # T3K, the doubles' call log.
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "TTNN_STUB_SIMULATE", "MESHSERVE_TEST_TT_CALL_LOG")}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(DOUBLES / "stubs"), saved["PYTHONPATH"]]))
    os.environ["TTNN_STUB_SIMULATE"] = "8:T3K"
    os.environ["MESHSERVE_TEST_TT_CALL_LOG"] = str(log)
    try:
        with simulated_cluster({"num_cpus": 2, "resources": {"TTNPU": 16}}, []) as (cluster, _):
            url = f"http://127.0.0.1:{port}"
            with _serve_run(config, cluster.address, tmp / "serve_run.log") as proc:
                _wait_healthy([f"{url}/{name}/health" for name in APPS], proc, tmp / "serve_run.log")
                yield {"url": url, "log": log}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _serve_run(config: Path, address: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``serve run`` on the cluster, in its own process group; stopped by SIGTERM to the group
    (it ignores SIGINT in the background) before the cluster goes down."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "serve"), "run", str(config), "--address", address],
            cwd=REPO_ROOT,
            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _wait_healthy(urls: list[str], proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"serve run exited {proc.returncode}:\n{log.read_text()[-4000:]}"
        try:
            if all(httpx.get(u, timeout=5).status_code == 200 for u in urls):
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise AssertionError(f"not healthy in {START_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")


def _prompt(n: int, seed: int) -> list[int]:
    return [3 + (seed * 31 + i * 17) % 1000 for i in range(n)]


# (prompt, max_tokens, host sampling via logprobs), one after the other: a device-sampled request
# whose positions cross a block boundary (12 + 8 tokens, block_size 16: the page table grows while
# the inputs stay resident), then a host-sampled one.
REQUESTS = [(_prompt(12, 1), 8, False), (_prompt(9, 2), 4, True)]


def _serve_requests(url: str, app: str) -> list[list[int]]:
    client = openai.OpenAI(base_url=f"{url}/{app}/v1", api_key="unused", max_retries=0, timeout=300)
    got = []
    for prompt, max_tokens, host in REQUESTS:
        out = client.completions.create(
            model="tiny-llama",
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0,
            logprobs=1 if host else None,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        got.append(out.choices[0].model_extra["token_ids"])
    return got


def _calls(log: Path, cls: str) -> list[dict]:
    """The one replica's calls of ``cls``, in order (warmup decodes dropped)."""
    by_instance: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        if rec["class"] == cls:
            by_instance[(rec["pid"], rec["instance"])].append(rec)
    served = [recs for recs in by_instance.values() if any(r["event"] == "prefill" for r in recs)]
    assert len(served) == 1, f"{cls}: {len(served)} serving instances"
    out, after_warmup = [], False
    for rec in served[0]:
        if rec["event"] == "warmup_decode":
            after_warmup = True
        elif rec["event"] == "decode" and after_warmup:
            after_warmup = False  # the warmup's own decode
        elif rec["event"] in ("prefill", "decode"):
            out.append(rec)
    return out


def _check_greedy(url: str, app: str, tiny_llama: Path) -> None:
    got = _serve_requests(url, app)
    for (prompt, max_tokens, _), ids in zip(REQUESTS, got, strict=True):
        assert ids == hf_greedy(tiny_llama, prompt, max_tokens), (app, prompt)


def test_v1_generator_serves_greedy_equal_to_hf_with_the_transition_tables_commands(served, tiny_llama):
    _check_greedy(served["url"], "v1", tiny_llama)
    calls = _calls(served["log"], CLASSES["v1"])
    # The transition table replayed over the steps as they happened (the contract document's
    # rows, not the engine's code): first decode / after a prefill / slots added or removed /
    # host->device switch: full reload, sampling params and state reset on the device; steady
    # host: full reload; steady device (traced, supports_async_decode): inputs resident, page
    # tables only when they changed.
    pending, last_on_device, last_rows, last_table = True, False, None, None
    seen = defaultdict(int)
    for rec in calls:
        if rec["event"] == "prefill":
            pending = True
            continue
        assert "reset_batch" not in rec, rec
        assert all(isinstance(rec[c], bool) for c in COMMANDS), rec
        assert not (rec["reload_inputs"] and rec["reload_page_table"]), rec
        assert rec["reload_inputs"] or not rec["reset_sampling_state"], rec
        assert rec["slot_remap"] == list(range(len(rec["start_pos"]))), rec
        rows = frozenset(i for i, p in enumerate(rec["start_pos"]) if p >= 0)
        on_device = rec["on_device"]
        switch = on_device and not last_on_device
        if pending or rows != last_rows or switch:
            expected, kind = (True, False, on_device, on_device), "transition"
            if switch and not pending and rows == last_rows:
                kind = "host->device switch"
        elif not on_device:
            expected, kind = (True, False, False, False), "steady host"
        else:
            table_changed = rec["page_table"] != last_table
            expected = (False, table_changed, False, False)
            kind = "page-table refresh" if table_changed else "steady device"
        assert tuple(rec[c] for c in COMMANDS) == expected, (kind, rec)
        seen[kind] += 1
        pending, last_on_device, last_rows, last_table = False, on_device, rows, rec["page_table"]
    assert {"transition", "steady host", "steady device", "page-table refresh"} <= set(seen), dict(seen)


def test_v0_generator_still_gets_reset_batch_and_no_commands(served, tiny_llama):
    _check_greedy(served["url"], "v0", tiny_llama)
    calls = _calls(served["log"], CLASSES["v0"])
    decodes = [r for r in calls if r["event"] == "decode"]
    assert decodes
    # The legacy shape: reset_batch on every device-sampling decode and nothing of version 1; true
    # on the first device decode after a prefill (a slot's new request: the host's inputs count)
    # and whenever the rows change, false in steady state.
    after_prefill, last_rows = True, None
    for rec in calls:
        if rec["event"] == "prefill":
            after_prefill = True
            continue
        assert not set(rec["keywords"]) & {*COMMANDS, "slot_remap"}, rec
        assert ("reset_batch" in rec) == rec["on_device"], rec
        rows = frozenset(i for i, p in enumerate(rec["start_pos"]) if p >= 0)
        if rec["on_device"] and (after_prefill or rows != last_rows):
            assert rec["reset_batch"] is True, rec
        after_prefill, last_rows = False, rows
    device = [r for r in decodes if r["on_device"]]
    assert any(r["reset_batch"] for r in device) and any(not r["reset_batch"] for r in device)
    assert any(not r["on_device"] for r in decodes)  # the logprobs request's host decodes
