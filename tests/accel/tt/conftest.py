"""``ttnn_stub``: the import-compatible ttnn stub on sys.path for one test (never globally)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

STUBS_DIR = Path(__file__).resolve().parents[2] / "doubles" / "stubs"
EXTRA_MODELS_DIR = STUBS_DIR / "extra_models"
# tt-metal's contract with HF's numbers, registered as a user registers a tt-metal class.
CONTRACT_MODELS_DIR = STUBS_DIR.parent / "tt_metal_contract"
# The decode-contract version-1 generator (Llama only), its own EXTRA_MODELS_DIR.
CONTRACT_V1_MODELS_DIR = CONTRACT_MODELS_DIR / "v1"
_STUB_MODULES = ("ttnn", "fake_tt_model", "hf_contract_generator", "hf_contract_generator_v1", "hf_qwen25_vl_generator")


def _drop_stub_modules() -> None:
    for name in [m for m in sys.modules if m.split(".")[0] in _STUB_MODULES]:
        del sys.modules[name]


@pytest.fixture
def ttnn_stub(monkeypatch):
    monkeypatch.syspath_prepend(str(STUBS_DIR))
    monkeypatch.setattr(sys, "path", list(sys.path))  # bundles appended by the registry are undone too
    _drop_stub_modules()
    import ttnn

    ttnn._stub_simulate(0)
    yield ttnn
    _drop_stub_modules()
