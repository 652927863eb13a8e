"""Every TPU-backend name meshserve relies on holds against the real packages.

tpu-inference: its 0.32.0 wheel from PyPI, read as source (``accel.vllm.tpu.contract``; importing
it needs JAX + libtpu). torch-tpu: its 0.2.0 wheel's metadata. vLLM's side (the built-in TPU
plugin, env vars, ``ParallelConfig.placement_group``, the connector registry): the installed
vLLM. vllm-torchtpu's plugin is not on PyPI: its names are encoded with the upstream commits
(``backends.TORCHTPU_SOURCE``) and checked by the replica at start-up on a TPU host; here we check
that start-up check itself (it passes on real code, and names what is missing). No test skips:
nothing here needs a 3.12 interpreter (the wheels are downloaded for 3.12 and read, not run).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from accel.vllm.tpu import contract
from accel.vllm.tpu.backends import BACKENDS, TORCHTPU, TORCHTPU_SOURCE, TPU_INFERENCE
from accel.vllm.tpu.contract import check_backend, entry_points_of, tree_finder
from tests.conftest import REPO_ROOT

_vllm_spec = importlib.util.find_spec("vllm")
assert _vllm_spec is not None and _vllm_spec.origin is not None
VLLM = Path(_vllm_spec.origin).parent  # the installed vLLM's source, read without importing it


def test_tpu_inference_names_hold_in_its_wheel(tpu_wheels):
    problems = check_backend(TPU_INFERENCE, tree_finder(tpu_wheels["tpu-inference"].root))
    assert problems == []


def test_checker_names_what_drifted(tpu_wheels, tmp_path):
    """The check is not vacuous: a platform that drops a connector and renames its Ray device
    key, and an executor that stops reusing the caller's placement group, are each named."""
    root = tmp_path / "tree"
    shutil.copytree(tpu_wheels["tpu-inference"].root / "tpu_inference", root / "tpu_inference")
    platform = root / "tpu_inference/platforms/tpu_platform.py"
    src = platform.read_text()
    assert '"TPUOffloadConnector", ' in src and 'ray_device_key: str = "TPU"' in src
    platform.write_text(
        src.replace('"TPUOffloadConnector", ', "").replace('ray_device_key: str = "TPU"', 'ray_device_key: str = "tpu"')
    )
    executor = root / "tpu_inference/executors/ray_distributed_executor.py"
    executor.write_text(executor.read_text().replace("placement_group is not None", "placement_group is None"))
    problems = "\n".join(check_backend(TPU_INFERENCE, tree_finder(root)))
    assert "accepts KV connectors ['RaidenOffloadConnector', 'TPUConnector', 'TPUConnectorHMA']" in problems
    assert "TpuPlatform.ray_device_key is 'tpu', we rely on 'TPU'" in problems
    assert "RayDistributedExecutor no longer reuses parallel_config.placement_group" in problems


def test_per_host_vs_per_chip_workers_is_read_from_the_executor(tpu_wheels):
    """tpu-inference sizes each Ray worker by bundle 0's TPU count (one JAX process per host);
    encoding torchtpu's per-chip placement against it is reported."""
    per_chip = dataclasses.replace(TPU_INFERENCE, workers="per_chip")
    problems = check_backend(per_chip, tree_finder(tpu_wheels["tpu-inference"].root))
    assert any("gives each worker per_host TPU share, we place workers per_chip" in p for p in problems)


def test_vllm_selects_tpu_inference_through_its_builtin_plugin(tpu_wheels):
    """vLLM's built-in ``tpu`` plugin returns ``vllm.platforms.tpu.TpuPlatform``, which is
    tpu-inference's class: what ``backends.TPU_INFERENCE.platform_cls`` names."""
    plugin = ast.parse((VLLM / "platforms/__init__.py").read_text())
    fn = next(n for n in ast.walk(plugin) if isinstance(n, ast.FunctionDef) and n.name == "tpu_platform_plugin")
    assert "vllm.platforms.tpu.TpuPlatform" in {c.value for c in ast.walk(fn) if isinstance(c, ast.Constant)}
    reexport = ast.parse((VLLM / "platforms/tpu.py").read_text())
    assert any(
        isinstance(n, ast.ImportFrom) and n.module == "tpu_inference.platforms" and n.names[0].name == "TpuPlatform"
        for n in ast.walk(reexport)
    )
    init = ast.parse((tpu_wheels["tpu-inference"].root / "tpu_inference/platforms/__init__.py").read_text())
    module, cls = TPU_INFERENCE.platform_cls.rsplit(".", 1)
    assert any(
        isinstance(n, ast.ImportFrom) and n.module == module and any(a.name == cls for a in n.names)
        for n in ast.walk(init)
    )


def test_vllm_names_both_backends_rely_on():
    """Read in the installed vLLM's source (importing vllm.config costs ~20 s on 2 cores)."""
    env_names = _dict_keys(ast.parse((VLLM / "envs.py").read_text()), "environment_variables")
    for var in ("VLLM_XLA_CACHE_PATH", "VLLM_USE_RAY_V2_EXECUTOR_BACKEND", "VLLM_PLUGINS", "VLLM_TARGET_DEVICE"):
        assert var in env_names
    # The slice group handed to the backend's Ray executor is a ParallelConfig field.
    parallel = _class(ast.parse((VLLM / "config/parallel.py").read_text()), "ParallelConfig")
    assert "placement_group" in {n.target.id for n in parallel.body if isinstance(n, ast.AnnAssign)}
    # torchtpu registers its Raiden/Multi connectors by name through this call; vLLM-side
    # connectors a backend accepts are registered under that name and module.
    factory_src = (VLLM / "distributed/kv_transfer/kv_connector/factory.py").read_text()
    register = next(
        n for n in ast.walk(ast.parse(factory_src)) if isinstance(n, ast.FunctionDef) and n.name == "register_connector"
    )
    assert [a.arg for a in register.args.args] == ["cls", "name", "module_path", "class_name"]
    for backend in BACKENDS.values():
        for spec in backend.connectors:
            if spec.module_path.startswith("vllm."):
                assert f'"{spec.name}",\n    "{spec.module_path}",' in factory_src
                module_file = VLLM.parent.joinpath(*spec.module_path.split(".")).with_suffix(".py")
                assert _class(ast.parse(module_file.read_text()), spec.name) is not None


def test_torch_tpu_wheel_facts(tpu_wheels):
    """torch-tpu registers a ``torch.backends`` entry point (so ``import torch`` auto-imports it
    unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``, which the CPU stand-in sets) and needs a libtpu
    that tpu-inference's pin excludes: the two backends never share one environment."""
    tt = tpu_wheels["torch-tpu"]
    assert entry_points_of(tt.dist_info)["torch.backends"] == {"torch_tpu": "torch_tpu._loader:load"}
    torch_spec = importlib.util.find_spec("torch")
    assert torch_spec is not None and torch_spec.origin is not None
    assert 'os.getenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "1"' in Path(torch_spec.origin).read_text()
    libtpu = {name: _requires(w.dist_info)["libtpu"] for name, w in tpu_wheels.items()}
    pinned = next(iter(libtpu["tpu-inference"].specifier)).version
    assert pinned not in libtpu["torch-tpu"].specifier, libtpu
    for w in tpu_wheels.values():
        assert "3.12" in _requires_python(w.dist_info)


def test_extras_keep_the_backends_apart_and_admit_312(tpu_wheels):
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert SpecifierSet(project["requires-python"]).contains("3.12")
    extras = {k: [Requirement(r) for r in v] for k, v in project["optional-dependencies"].items()}
    names = {k: {r.name for r in v} for k, v in extras.items()}
    assert "vllm-tpu" in names["tpu"] and "torch-tpu" not in names["tpu"]
    assert "torch-tpu" in names["tpu-torchtpu"] and "vllm-tpu" not in names["tpu-torchtpu"]
    for extra in ("tpu", "tpu-torchtpu"):
        for req in extras[extra]:
            for version in TPU_INFERENCE.python_versions:
                assert req.marker is None or req.marker.evaluate({"python_version": version})


def test_startup_check_passes_on_real_code_and_names_what_is_missing(tpu_wheels, monkeypatch):
    monkeypatch.syspath_prepend(str(tpu_wheels["tpu-inference"].root))
    contract._parse.cache_clear()
    contract.verify_installed(TPU_INFERENCE)  # real tpu-inference source on sys.path: no problem
    assert "tpu_inference" not in sys.modules  # read, never imported
    with pytest.raises(RuntimeError, match=r"tpu_backend 'torchtpu' but its package 'vllm_torchtpu' is not installed"):
        contract.verify_installed(TORCHTPU)


def test_torchtpu_names_carry_their_upstream_commits():
    """Every torchtpu module we name lives in a file whose upstream commit is recorded."""
    assert all(len(c) == 40 for c in TORCHTPU_SOURCE.values())
    assert "src/vllm_torchtpu/platforms/tpu_platform.py" in TORCHTPU_SOURCE
    assert TORCHTPU.platform_entry_point == "vllm_torchtpu.platforms:register_tpu_platform"
    assert contract.check_platform_plugin(TORCHTPU, {"vllm.platform_plugins": {}}) != []
    assert (
        contract.check_platform_plugin(TORCHTPU, {"vllm.platform_plugins": {"torchtpu": TORCHTPU.platform_entry_point}})
        == []
    )


def _requires(dist_info: Path) -> dict[str, Requirement]:
    out = {}
    for line in (dist_info / "METADATA").read_text().splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            out[req.name] = req
    return out


def _requires_python(dist_info: Path) -> SpecifierSet:
    for line in (dist_info / "METADATA").read_text().splitlines():
        if line.startswith("Requires-Python:"):
            return SpecifierSet(line.split(":", 1)[1].strip())
    return SpecifierSet()


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _dict_keys(tree: ast.Module, name: str) -> set[str]:
    for n in ast.walk(tree):
        target = n.target if isinstance(n, ast.AnnAssign) else (n.targets[0] if isinstance(n, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == name and isinstance(n.value, ast.Dict):
            return {k.value for k in n.value.keys if isinstance(k, ast.Constant)}
    raise AssertionError(f"no dict {name}")


def test_replica_startup_check_names_the_wrong_or_broken_backend(tpu_wheels, tmp_path, monkeypatch):
    """``require_backend`` (run by the engine on a TPU host before vLLM starts): tpu-inference
    passes on its real code; an installed vllm_torchtpu would hijack a tpu-inference pool; a
    torchtpu install lacking what we rely on is named piece by piece."""
    from accel.vllm.platform import require_backend

    monkeypatch.syspath_prepend(str(tpu_wheels["tpu-inference"].root))
    contract._parse.cache_clear()
    require_backend(TPU_INFERENCE)
    broken = tmp_path / "site"
    (broken / "vllm_torchtpu" / "platforms").mkdir(parents=True)
    (broken / "vllm_torchtpu" / "__init__.py").write_text("")
    (broken / "vllm_torchtpu" / "platforms" / "__init__.py").write_text("")
    (broken / "vllm_torchtpu" / "platforms" / "tpu_platform.py").write_text("class TpuPlatform:\n    pass\n")
    monkeypatch.syspath_prepend(str(broken))
    with pytest.raises(RuntimeError, match="vllm_torchtpu is installed here"):
        require_backend(TPU_INFERENCE)
    with pytest.raises(RuntimeError) as err:
        require_backend(TORCHTPU)
    text = str(err.value)
    assert "TpuPlatform.ray_device_key is None, we rely on 'TPU'" in text
    assert "module vllm_torchtpu.executors.ray_distributed_executor is not installed" in text
    assert "module vllm_torchtpu.offload.raiden_connector is not installed" in text
    assert "no vllm.platform_plugins entry point vllm_torchtpu.platforms:register_tpu_platform" in text
