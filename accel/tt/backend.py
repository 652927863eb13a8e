"""Choosing where mesh models run: a Tenstorrent mesh through ttnn, or the torch program.

``open_backend("ttnn", ...)`` imports ttnn, counts chips and opens the mesh; any failure becomes one
``NoTenstorrentDevice`` ("no Tenstorrent device found: <reason>") with the ttnn backtrace dropped.
``"auto"`` falls back to the torch backend on exactly that error. ``MeshBackend.load_model``
resolves the architecture in the registry and calls the class's ``initialize_vllm_model``,
passing optional keywords only where that classmethod accepts them (tt-metal signatures drift).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from accel import envs
from accel.tt.mesh_device import MeshDeviceConfig, OpenedMesh, close_mesh, open_mesh, parse_mesh_grid
from accel.tt.mesh_model import MeshModel
from accel.tt.registry import BACKEND_TORCH, BACKEND_TTNN, ModelRegistry, build_registry

logger = logging.getLogger(__name__)

BACKEND_AUTO = "auto"
# tt-metal ``Generator``'s set of slots whose next decode takes the host's inputs (its async-ahead
# keep skips them); see ``TtnnMeshModel.use_host_inputs``.
PREFILLED_SLOTS_ATTR = "_slots_prefilled_since_decode"


class NoTenstorrentDevice(RuntimeError):
    """The TTNN path is unavailable here; the message says why in one line."""


@dataclass(frozen=True)
class TtnnEvent:
    """``DeviceEvent`` over a ttnn ``MeshEvent`` (what tt-metal's ``read_decode_output`` returns)."""

    ttnn: Any
    event: Any

    def synchronize(self) -> None:
        self.ttnn.event_synchronize(mesh_event=self.event)


class TtnnMeshModel:
    """A tt-metal generator as the engine drives it. Calls pass straight through, except
    ``read_decode_output(async_read=True)``, whose raw ttnn ``MeshEvent``s are wrapped so the
    engine's ``event.synchronize()`` is ``ttnn.event_synchronize(event)`` (what the plugin's
    ``finalize_decode`` calls)."""

    def __init__(self, model: Any, ttnn: Any) -> None:
        self._model = model
        self._ttnn = ttnn
        self.model_capabilities = dict(getattr(type(model), "model_capabilities", None) or {})

    def read_decode_output(self, tt_out: Any, async_read: bool = False) -> Any:
        if not async_read:
            return self._model.read_decode_output(tt_out, async_read=False)
        host_out, events = self._model.read_decode_output(tt_out, async_read=True)
        return host_out, [TtnnEvent(self._ttnn, ev) for ev in events or ()]

    def use_host_inputs(self, slots: Sequence[int]) -> None:
        """Make the next ``decode_forward`` take ``slots``' tokens and positions from the host.

        At a ``reset_batch`` decode with device sampling, tt-metal's ``Generator.decode_forward``
        keeps, per slot, the token and position its previous decode left in the trace's device
        inputs whenever they continue the host's (device position == host position or host + 1):
        under vLLM's async scheduling the host trails the device by one step. It skips the slots
        in ``_slots_prefilled_since_decode``, which its ``prefill_forward_text`` fills and every
        decode clears. A request whose prompt KV was imported (PD) starts decoding in a slot this
        generator never prefilled for it; unmarked, a previous occupant's unconsumed token would be
        decoded in its place whenever the positions happen to line up. The runner marks the slots
        with a new occupant at each changed batch, and every row when sampling moves from the host
        to the device (the buffers then hold a host-sampled step's inputs). Its host inputs are
        never behind (it feeds the in-flight step's tokens), so a mark cannot lose a token. A class
        without the keep ignores the attribute."""
        marked = getattr(self._model, PREFILLED_SLOTS_ATTR, None)
        if not isinstance(marked, set):
            marked = set()
            setattr(self._model, PREFILLED_SLOTS_ATTR, marked)
        marked.update(int(s) for s in slots)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def ttnn_error_reason(exc: BaseException) -> str:
    """The human part of a TT_FATAL message (the line after ``info:``), without the backtrace."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if "info:" in lines:
        i = lines.index("info:")
        if i + 1 < len(lines):
            return lines[i + 1]
    return lines[0] if lines else type(exc).__name__


def load_mesh_model(
    model_class: type[MeshModel], hf_config: Any, mesh_device: Any, max_batch_size: int, **optional: Any
) -> Any:
    """``model_class.initialize_vllm_model(hf_config, mesh_device, max_batch_size, **accepted)``,
    where ``accepted`` keeps the ``optional`` keywords (max_seq_len, n_layers, tt_data_parallel,
    optimizations, ...) the classmethod's signature names, or all of them if it takes ``**kwargs``."""
    init = model_class.initialize_vllm_model
    params = inspect.signature(init).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    accepted = {k: v for k, v in optional.items() if takes_any or k in params}
    dropped = sorted(set(optional) - set(accepted))
    if dropped:
        logger.info("%s.initialize_vllm_model does not take %s; not passed", model_class.__name__, dropped)
    return init(hf_config, mesh_device, max_batch_size, **accepted)


@dataclass
class MeshBackend:
    kind: str  # "ttnn" | "torch"
    mesh: OpenedMesh | None = None
    ttnn: Any = None
    registry: ModelRegistry = field(default_factory=build_registry)

    @property
    def mesh_device(self) -> Any:
        return None if self.mesh is None else self.mesh.device

    def model_class(self, hf_config: Any) -> type[MeshModel]:
        return self.registry.resolve(hf_config, self.kind)

    def load_model(self, hf_config: Any, max_batch_size: int, **optional: Any) -> Any:
        """A ``MeshModel``: the torch program, or a tt-metal generator behind ``TtnnMeshModel``."""
        model = load_mesh_model(self.model_class(hf_config), hf_config, self.mesh_device, max_batch_size, **optional)
        return self.adapt(model)

    def adapt(self, model: Any) -> Any:
        """What the engine drives: a ttnn model behind ``TtnnMeshModel`` (device events with
        ``synchronize``), any other as it is."""
        return TtnnMeshModel(model, self.ttnn) if self.kind == BACKEND_TTNN else model

    def close(self) -> None:
        if self.mesh is not None:
            close_mesh(self.ttnn, self.mesh)
            self.mesh = None


def open_backend(
    kind: str, mesh_config: MeshDeviceConfig | None = None, registry: ModelRegistry | None = None
) -> MeshBackend:
    """``kind``: "ttnn" (raise ``NoTenstorrentDevice`` if unusable), "torch", or "auto"."""
    registry = registry or build_registry()
    if kind == BACKEND_TORCH:
        return MeshBackend(BACKEND_TORCH, registry=registry)
    if kind not in (BACKEND_TTNN, BACKEND_AUTO):
        raise ValueError(f"backend must be 'ttnn', 'torch' or 'auto', got {kind!r}")
    try:
        return _open_ttnn(mesh_config, registry)
    except NoTenstorrentDevice as exc:
        if kind == BACKEND_TTNN:
            raise
        logger.info("%s; using the torch mesh model", exc)
        return MeshBackend(BACKEND_TORCH, registry=registry)


def _open_ttnn(mesh_config: MeshDeviceConfig | None, registry: ModelRegistry) -> MeshBackend:
    try:
        import ttnn  # deferred: only the TTNN path imports ttnn (absent off Tenstorrent hosts)
    except Exception as exc:  # ImportError, or a broken install raising anything at import
        raise NoTenstorrentDevice(
            f"no Tenstorrent device found: the ttnn package is not importable "
            f"({type(exc).__name__}: {ttnn_error_reason(exc)})"
        ) from None
    try:
        num_chips = ttnn.get_num_devices()
    except RuntimeError as exc:
        raise NoTenstorrentDevice(f"no Tenstorrent device found: {ttnn_error_reason(exc)}") from None
    num_chips = len(num_chips) if isinstance(num_chips, (list, tuple)) else int(num_chips)
    if num_chips < 1:
        raise NoTenstorrentDevice("no Tenstorrent device found: ttnn reports 0 chips")
    config = mesh_config or MeshDeviceConfig()
    if config.grid is None:
        config = dataclasses.replace(config, grid=parse_mesh_grid(envs.ENVS.mesh_device, num_chips))
    if config.num_devices > num_chips:
        raise NoTenstorrentDevice(
            f"no Tenstorrent device found for mesh {config.grid}: "
            f"{config.num_devices} chips needed, {num_chips} present"
        )
    try:
        mesh = open_mesh(ttnn, config)
    except RuntimeError as exc:
        raise NoTenstorrentDevice(
            f"no Tenstorrent device found: opening mesh {config.grid} failed: {ttnn_error_reason(exc)}"
        ) from None
    return MeshBackend(BACKEND_TTNN, mesh=mesh, ttnn=ttnn, registry=registry)
