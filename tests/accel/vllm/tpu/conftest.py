"""``tpu_wheels``: the real TPU backend wheels from PyPI, unpacked (``--no-deps``) once per machine.

Their full dependency sets (JAX + libtpu, a CUDA torch through torchvision's pin) are too heavy
for CI and import nothing useful without a TPU, so the contract tests read the source instead.
Fetched with the running interpreter's pip (``--python-version 3.12``: both wheels are
cp312-installable, and no 3.12 interpreter is needed to download or read them) into
``~/.cache/meshserve/wheels`` and reused; only ``.py`` files and the dist-info are unpacked.
Measured on this 2-core VM: tpu-inference 0.32.0 2.3 MB (download ~3.5 s), torch-tpu 0.2.0
cp312 ~96 MB (download ~4 s, unpack of its .py/dist-info < 1 s).
"""

from __future__ import annotations

import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from accel.envs import ENVS

WHEELS = {
    "tpu-inference": ("tpu-inference==0.32.0", "tpu_inference-0.32.0-*.whl"),
    "torch-tpu": ("torch-tpu==0.2.0", "torch_tpu-0.2.0-cp312-*.whl"),
}


@dataclass(frozen=True)
class UnpackedWheel:
    root: Path  # the unpacked tree (packages + *.dist-info)
    wheel: Path
    size_bytes: int
    fetch_s: float  # 0 when it came from the cache

    @property
    def dist_info(self) -> Path:
        return next(self.root.glob("*.dist-info"))


def _fetch(requirement: str, pattern: str, cache: Path) -> tuple[Path, float]:
    found = sorted(cache.glob(pattern))
    if found:
        return found[0], 0.0
    start = time.monotonic()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12"]
    cmd += ["--platform", "manylinux_2_31_x86_64", "--platform", "any", "-d", str(cache), requirement]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.fail(f"could not download {requirement} from PyPI (needed by the TPU contract tests):\n{done.stderr}")
    return sorted(cache.glob(pattern))[0], time.monotonic() - start


def _unpack(wheel: Path, dest: Path) -> None:
    if (dest / ".unpacked").exists():
        return
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.endswith(".py") or ".dist-info/" in name:
                z.extract(name, dest)
    (dest / ".unpacked").touch()


@pytest.fixture(scope="session")
def tpu_wheels() -> dict[str, UnpackedWheel]:
    cache = ENVS.checkpoint_dir.parent / "wheels"
    cache.mkdir(parents=True, exist_ok=True)
    out = {}
    for key, (requirement, pattern) in WHEELS.items():
        wheel, fetch_s = _fetch(requirement, pattern, cache)
        root = cache / wheel.name.removesuffix(".whl")
        _unpack(wheel, root)
        out[key] = UnpackedWheel(root, wheel, wheel.stat().st_size, fetch_s)
    return out
