from pathlib import Path

from accel.vllm.engine import engine_environment

CACHE = Path("/var/cache/xla/llama-1234")


def test_compile_cache_is_ours_unless_the_user_set_one():
    assert engine_environment({}, CACHE, is_tpu=False, uses_ray_executor=False) == {"VLLM_XLA_CACHE_PATH": str(CACHE)}
    user = {"VLLM_XLA_CACHE_PATH": "/mnt/shared/xla"}
    assert engine_environment(user, CACHE, is_tpu=True, uses_ray_executor=False) == {}


def test_multi_host_slices_run_the_backends_ray_executor():
    out = engine_environment({}, CACHE, is_tpu=True, uses_ray_executor=True)
    assert out["TPU_MULTIHOST_BACKEND"] == "ray" and "VLLM_USE_RAY_V2_EXECUTOR_BACKEND" not in out
    dp = engine_environment({}, CACHE, is_tpu=True, uses_ray_executor=True, data_parallel_size=2)
    assert dp["VLLM_USE_RAY_V2_EXECUTOR_BACKEND"] == "1"
    # the user's choice stands; and the CPU stand-in never asks for a TPU executor
    assert "TPU_MULTIHOST_BACKEND" not in engine_environment(
        {"TPU_MULTIHOST_BACKEND": "mp"}, CACHE, is_tpu=True, uses_ray_executor=True
    )
    assert "TPU_MULTIHOST_BACKEND" not in engine_environment({}, CACHE, is_tpu=False, uses_ray_executor=True)
