"""Every environment variable meshserve reads, typed, read once, one prefix.

Environment variables tune where things live and how noisy they are; they never pick a class or
the application's topology (config does that). Variables that belong to other projects (vLLM's
``VLLM_*``, tt-metal's ``MESH_DEVICE``, ``EXTRA_MODELS_DIR``) are read where those projects
define them, and listed here only when we read them ourselves.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path


def _bool(value: str | None, default: bool) -> bool:
    if value is None or value == "":
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Envs:
    # Folder holding the tiny offline checkpoints (tiny-llama, tiny-qwen3).
    checkpoint_dir: Path
    # tt-metal registry knobs, spelled as vllm-tt-plugin spells them.
    extra_models_dir: str | None
    tt_builtin_models: bool
    mesh_device: str | None
    # Which tt-metal generator serves Llama / Qwen3 / Qwen3.5 (vllm-tt-plugin's switches).
    tt_llama_text_ver: str
    tt_qwen3_text_ver: str
    tt_qwen35_text_ver: str
    # Root of the per-model XLA compile caches of TPU replicas (VLLM_XLA_CACHE_PATH per model).
    xla_cache_dir: Path
    # Interpreter of a Python 3.12 venv with the real ttnn wheel (checks our ttnn calls' signatures).
    ttnn_python: Path
    # tmpfs folder holding the same-node KV transfer stores (accel/kv_transfer/shm_store.py).
    kv_shm_root: Path
    # The API key the ingress requires when ingress.api_keys is empty (vLLM's VLLM_API_KEY).
    api_key: str | None
    # Most stop strings a request may send (vLLM's VLLM_MAX_STOP_STRINGS, its default 4).
    max_stop_strings: int
    # Ray's, read by `make serve`'s pre-flight (serve_app/launch): whether Serve runs its HAProxy,
    # HAProxy's stats and metrics ports, the dashboard's token-authentication mode and token file.
    ray_serve_haproxy: bool
    ray_serve_haproxy_stats_port: int
    ray_serve_haproxy_metrics_port: int
    ray_auth_mode: str | None
    ray_auth_token_path: Path


def _read() -> Envs:
    default_ckpt = Path.home() / ".cache" / "meshserve" / "checkpoints"
    return Envs(
        checkpoint_dir=Path(os.environ.get("MESHSERVE_CHECKPOINT_DIR", default_ckpt)).expanduser(),
        extra_models_dir=os.environ.get("EXTRA_MODELS_DIR") or None,
        tt_builtin_models=_bool(os.environ.get("TT_VLLM_BUILTIN_MODELS"), True),
        mesh_device=os.environ.get("MESH_DEVICE") or None,
        tt_llama_text_ver=os.environ.get("TT_LLAMA_TEXT_VER") or "tt_transformers",
        tt_qwen3_text_ver=os.environ.get("TT_QWEN3_TEXT_VER") or "tt_transformers",
        tt_qwen35_text_ver=os.environ.get("TT_QWEN35_TEXT_VER") or "qwen36_blackhole",
        xla_cache_dir=Path(
            os.environ.get("MESHSERVE_XLA_CACHE_DIR", Path.home() / ".cache" / "meshserve" / "xla_cache")
        ).expanduser(),
        ttnn_python=Path(
            os.environ.get(
                "MESHSERVE_TTNN_PYTHON", Path.home() / ".cache" / "meshserve" / "ttnn-venv" / "bin" / "python"
            )
        ).expanduser(),
        kv_shm_root=Path(
            os.environ.get("MESHSERVE_KV_SHM_ROOT")
            or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
        ),
        api_key=os.environ.get("MESHSERVE_API_KEY") or None,
        max_stop_strings=int(os.environ.get("VLLM_MAX_STOP_STRINGS", "4")),
        ray_serve_haproxy=_bool(os.environ.get("RAY_SERVE_ENABLE_HA_PROXY"), False),
        ray_serve_haproxy_stats_port=int(os.environ.get("RAY_SERVE_HAPROXY_STATS_PORT") or 8404),
        ray_serve_haproxy_metrics_port=int(os.environ.get("RAY_SERVE_HAPROXY_METRICS_PORT") or 9101),
        ray_auth_mode=os.environ.get("RAY_AUTH_MODE") or None,
        ray_auth_token_path=Path(
            os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token"
        ).expanduser(),
    )


ENVS = _read()
