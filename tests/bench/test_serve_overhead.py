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
