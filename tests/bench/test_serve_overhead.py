"""bench/serve_overhead.py: a missing peer dependency is named before any server starts."""

from __future__ import annotations

import importlib.util

import pytest

from bench import serve_overhead


def test_ray_serve_llm_without_pyarrow_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a))
    with pytest.raises(SystemExit, match=r"pyarrow: pip install -e '\.\[bench\]'"):
        serve_overhead.require_bench_extra()


def test_ray_serve_llm_with_pyarrow_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    present = object()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: present if name == "pyarrow" else real(name, *a))
    serve_overhead.require_bench_extra()  # no exit


def test_the_in_process_tt_engine_gets_the_served_engines_thread_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's rule for its workers (``OMP_NUM_THREADS`` = max(floor(num_cpus), 1) unless set), over
    the process that hosts the engine: the ingress's CPUs count when the engine sits in it."""
    import dataclasses

    import torch
    import yaml

    from serve_app.config.load import load_app_config
    from tests.doubles.app_args import LOCAL_YAML

    app = load_app_config(yaml.safe_load(LOCAL_YAML.read_text())["applications"][0]["args"])
    pool = dataclasses.replace(app.pools[0], num_cpus=0.0)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # (the test process keeps its own)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert serve_overhead.served_torch_threads(app, pool) == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    in_ingress = dataclasses.replace(pool, num_cpus=1.5, placement="ingress")
    roomy = dataclasses.replace(app, ingress=dataclasses.replace(app.ingress, num_cpus=1.0))
    assert serve_overhead.served_torch_threads(roomy, in_ingress) == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # set by the user: Ray keeps it, so does the bench
    assert serve_overhead.served_torch_threads(roomy, in_ingress) == 3
