"""TPU slice shapes: accelerator generation + topology string -> hosts and chips.

A slice is the unit a TPU replica owns: ``num_hosts`` VMs with ``chips_per_host`` chips each,
wired together by ICI. The rules below are the public Cloud TPU / GKE ones, checked against the
table Ray 2.60 itself uses to reserve slices (``ray/_private/accelerators/tpu.py``:
``VALID_TPU_TOPOLOGY``, ``get_chips_per_host``), so a shape we accept is one Ray can reserve:

- v5e (Ray: ``v5litepod``) and v6e: 2D torus. Single-host shapes 1x1, 2x2, 2x4 put all their
  chips (1, 4, 8) on one VM; multi-host shapes 4x4, 4x8, 8x8, 8x16, 16x16 use 4-chip VMs
  (Cloud TPU "v5e"/"v6e" system architecture pages; GKE "Plan TPUs in GKE", topology table).
  A 2x4 may also be built from two 4-chip VMs (GKE ``ct6e-standard-4t`` multi-host 2x4); pass
  ``chips_per_host=4`` for that.
- v5p and v7x (Ironwood): 3D torus, always 4 chips per VM. 2x2x1 is one VM; larger shapes are
  2x2x2, 2x2x4, 2x4x4 and, for v5p, every AxBxC with A, B multiples of 4 up to 16 and C a
  multiple of 4 up to 24 (ordered A <= B <= C); v7x: 4x4x4, 4x4x8, 4x8x8, 8x8x8, 8x8x16, 8x16x16.
- Pod type names count TensorCores: v5e/v6e have 1 core per chip (``v6e-16`` = 16 chips),
  v5p/v7x have 2 (``v5p-8`` = 4 chips). Ray names the slice head resource ``TPU-<pod_type>-head``.

This module is pure: no Ray, no vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from accel.contract import ConfigError

_CHIPS_PER_MULTI_HOST_VM = 4


@dataclass(frozen=True)
class _Generation:
    name: str  # our spelling: v5e, v5p, v6e, v7x
    ray_version: str  # Ray's accelerator version: v5litepod, v5p, v6e, v7x
    num_dims: int  # 2 (torus) or 3 (3D torus)
    cores_per_chip: int  # TensorCores per chip; pod type names count cores
    single_host: dict[str, int]  # single-VM topologies -> chips on that VM
    multi_host: frozenset[str]  # topologies built from 4-chip VMs


def _v5p_3d() -> frozenset[str]:
    shapes = {"2x2x2", "2x2x4", "2x4x4"}
    for a in range(4, 17, 4):
        for b in range(a, 17, 4):
            for c in range(b, 25, 4):
                shapes.add(f"{a}x{b}x{c}")
    return frozenset(shapes)


_2D_SINGLE = {"1x1": 1, "2x2": 4, "2x4": 8}
_2D_MULTI = frozenset({"4x4", "4x8", "8x8", "8x16", "16x16"})

_GENERATIONS: dict[str, _Generation] = {
    "v5e": _Generation("v5e", "v5litepod", 2, 1, _2D_SINGLE, _2D_MULTI),
    "v6e": _Generation("v6e", "v6e", 2, 1, _2D_SINGLE, _2D_MULTI),
    "v5p": _Generation("v5p", "v5p", 3, 2, {"2x2x1": 4}, _v5p_3d()),
    "v7x": _Generation(
        "v7x",
        "v7x",
        3,
        2,
        {"2x2x1": 4},
        frozenset({"2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16"}),
    ),
}

# Spellings people use for the same generation (Ray, GKE machine families, Cloud TPU names).
_ALIASES = {
    "v5e": "v5e",
    "v5litepod": "v5e",
    "v5lite": "v5e",
    "tpu-v5litepod": "v5e",
    "tpu-v5e": "v5e",
    "v6e": "v6e",
    "tpu-v6e": "v6e",
    "v5p": "v5p",
    "tpu-v5p": "v5p",
    "v7x": "v7x",
    "tpu7x": "v7x",
    "tpu-v7x": "v7x",
}


def _generation(accelerator: str) -> _Generation:
    key = accelerator.strip().lower()
    if key not in _ALIASES:
        raise ConfigError(
            f"accelerator_type: unknown TPU generation {accelerator!r}; expected one of {sorted(_GENERATIONS)}"
        )
    return _GENERATIONS[_ALIASES[key]]


def _parse_dims(topology: str, gen: _Generation) -> tuple[int, ...]:
    parts = topology.strip().lower().split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise ConfigError(f"topology: {topology!r} is not of the form AxB or AxBxC") from None
    if len(dims) != gen.num_dims or any(d <= 0 for d in dims):
        form = "AxB" if gen.num_dims == 2 else "AxBxC"
        raise ConfigError(f"topology: {gen.name} slices are {gen.num_dims}D ({form}), got {topology!r}")
    return dims


@dataclass(frozen=True)
class SliceTopology:
    """One TPU slice: ``num_hosts`` VMs x ``chips_per_host`` chips. Invariant:
    ``num_chips == num_hosts * chips_per_host == product of the topology's dims``."""

    accelerator: str  # v5e | v5p | v6e | v7x
    topology: str  # normalized, e.g. "4x4", "2x2x1"
    chips_per_host: int
    num_hosts: int

    @property
    def num_chips(self) -> int:
        return self.chips_per_host * self.num_hosts

    @property
    def is_multi_host(self) -> bool:
        return self.num_hosts > 1

    @property
    def ray_accelerator_version(self) -> str:
        """Ray's generation name (``v5litepod`` for v5e), as ``SlicePlacementGroup`` expects it."""
        return _GENERATIONS[self.accelerator].ray_version

    @property
    def ray_accelerator_type(self) -> str:
        """Ray's accelerator type, e.g. ``TPU-V6E`` (node label ``ray.io/accelerator-type``)."""
        return "TPU-" + self.ray_accelerator_version.upper()

    @property
    def pod_type(self) -> str:
        """Cloud TPU pod type (cores, not chips), e.g. ``v6e-16``, ``v5p-8``
        (node label ``ray.io/tpu-pod-type``)."""
        gen = _GENERATIONS[self.accelerator]
        return f"{gen.ray_version}-{self.num_chips * gen.cores_per_chip}"

    @property
    def head_resource(self) -> str:
        """The resource Ray puts on worker 0 of every multi-host slice, e.g. ``TPU-v6e-16-head``."""
        return f"TPU-{self.pod_type}-head"


def parse_slice(accelerator: str, topology: str, chips_per_host: int | None = None) -> SliceTopology:
    """Validate ``accelerator`` x ``topology`` against the shapes that exist and size the slice.

    ``chips_per_host`` overrides the default only where both layouts exist (a v5e/v6e 2x4 as two
    4-chip VMs); anything else raises ``ConfigError`` naming the offending key.
    """
    gen = _generation(accelerator)
    dims = _parse_dims(topology, gen)
    norm = "x".join(str(d) for d in dims)
    num_chips = prod(dims)
    if norm in gen.single_host:
        default_chips = gen.single_host[norm]
    elif norm in gen.multi_host:
        default_chips = _CHIPS_PER_MULTI_HOST_VM
    else:
        known = sorted(set(gen.single_host) | gen.multi_host, key=lambda s: (prod(map(int, s.split("x"))), s))
        shown = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")
        raise ConfigError(f"topology: {gen.name} has no {norm} slice ({num_chips} chips); valid: {shown}")
    if chips_per_host is None:
        chips_per_host = default_chips
    elif chips_per_host != default_chips:
        allowed = gen.num_dims == 2 and norm == "2x4" and chips_per_host == _CHIPS_PER_MULTI_HOST_VM
        if not allowed:
            raise ConfigError(
                f"chips_per_host: a {gen.name} {norm} slice has {default_chips} chips per host, not {chips_per_host}"
            )
    return SliceTopology(
        accelerator=gen.name, topology=norm, chips_per_host=chips_per_host, num_hosts=num_chips // chips_per_host
    )
