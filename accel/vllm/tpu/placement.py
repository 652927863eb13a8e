"""Where one TPU slice replica runs: its Ray placement, pinned to ONE slice.

A replica owns a whole slice: one placement-group bundle per TPU host, ``{"TPU": chips_per_host,
"CPU": ...}``, bundle 0 also carrying the replica actor (Serve places the replica in bundle 0).
vLLM's Ray executor (multi-host slices, see ``accel.vllm.config``) starts one worker per bundle.

Pinning to one slice is the hard part: nothing in a static bundle list says "all on the same
slice". Ray 2.60 solves it at run time (``ray.util.tpu.SlicePlacementGroup``): reserve the slice's
head resource ``TPU-<pod_type>-head`` (present only on worker 0 of each multi-host slice), read
that node's slice name, then give every bundle the label selector
``{"ray.io/tpu-slice-name": <that name>}``. So there are two ways to place a replica:

- **static** (Serve creates the group from ``placement_group_bundles``): single-host slices (one
  bundle is trivially on one slice), or multi-host slices pinned to a named slice
  (``slice_name``), whose selector goes into ``placement_group_bundle_label_selector``;
- **deferred** (multi-host, any free slice): the Serve replica actor is small (CPU only) and
  creates a ``SlicePlacementGroup`` when it starts (``create_slice_placement_group``), then hands
  that group to vLLM. This is what Ray Serve LLM 2.60 does for TPU topologies
  (``TPUAccelerator.requires_deferred_placement_group``).

Labels used (Ray sets them on TPU nodes): ``ray.io/accelerator-type`` (``TPU-V6E``),
``ray.io/tpu-pod-type`` (``v6e-16``; multi-host only: a single-host replica may use part of a
bigger VM), ``ray.io/tpu-slice-name``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from accel.contract import ConfigError
from accel.vllm.tpu.backends import WorkerPlacement
from accel.vllm.tpu.topology import SliceTopology

if TYPE_CHECKING:
    from ray.util.tpu import SlicePlacementGroup

logger = logging.getLogger(__name__)

ACCELERATOR_TYPE_LABEL = "ray.io/accelerator-type"
POD_TYPE_LABEL = "ray.io/tpu-pod-type"
SLICE_NAME_LABEL = "ray.io/tpu-slice-name"


@dataclass(frozen=True)
class SlicePlacement:
    """The Ray placement of one slice replica.

    ``num_cpus_per_host``: CPUs each host bundle reserves for vLLM's worker process on that host;
    ``replica_num_cpus``: the replica actor's own CPUs (bundle 0 in static mode; the actor's
    options in deferred mode). ``slice_name`` pins a multi-host replica to that named slice.
    """

    slice: SliceTopology
    num_cpus_per_host: float = 1.0
    replica_num_cpus: float = 1.0
    slice_name: str | None = None
    # How the backend's Ray executor places its workers (``accel.vllm.tpu.backends``):
    # ``per_host`` (tpu-inference: one JAX process per host takes bundle 0's TPU count) or
    # ``per_chip`` (torchtpu: one process per chip, ``{"TPU": 1}`` each). Static placement
    # gives per-chip backends one ``{"TPU": 1}`` bundle per chip; deferred placement uses Ray's
    # per-host slice bundles, into which torchtpu packs ``chips_per_host`` workers each.
    workers: WorkerPlacement = "per_host"
    # None: SPREAD for per-host bundles (as Ray's SlicePlacementGroup: each holds a whole host's
    # chips, so they land on distinct hosts anyway); PACK for per-chip bundles (a host's chips
    # together), STRICT_PACK when the slice is one host.
    strategy: str | None = None

    def __post_init__(self) -> None:
        if self.num_cpus_per_host < 0 or self.replica_num_cpus < 0:
            raise ConfigError("num_cpus: CPU reservations must be >= 0")
        if self.strategy is None:
            per_host = self.workers == "per_host"
            default = "SPREAD" if per_host else ("PACK" if self.slice.is_multi_host else "STRICT_PACK")
            object.__setattr__(self, "strategy", default)
        if self.strategy not in ("SPREAD", "STRICT_SPREAD", "PACK", "STRICT_PACK"):
            raise ConfigError(f"placement_group_strategy: unknown strategy {self.strategy!r}")

    @property
    def is_deferred(self) -> bool:
        """True when the replica must create its slice placement group itself at start."""
        return self.slice.is_multi_host and self.slice_name is None

    @property
    def host_bundle(self) -> dict[str, float]:
        """What every host bundle of a slice reserves (SlicePlacementGroup's per-bundle resources)."""
        bundle: dict[str, float] = {"TPU": float(self.slice.chips_per_host)}
        if self.num_cpus_per_host:
            bundle["CPU"] = float(self.num_cpus_per_host)
        return bundle

    @property
    def bundles(self) -> tuple[dict[str, float], ...]:
        """Static mode: one bundle per host (``per_host``) or per chip (``per_chip``, a host's
        CPUs split over its chips); bundle 0 also carries the replica actor's CPUs."""
        if self.workers == "per_host":
            bundles = [dict(self.host_bundle) for _ in range(self.slice.num_hosts)]
        else:
            chip: dict[str, float] = {"TPU": 1.0}
            if self.num_cpus_per_host:
                chip["CPU"] = self.num_cpus_per_host / self.slice.chips_per_host
            bundles = [dict(chip) for _ in range(self.slice.num_chips)]
        if self.replica_num_cpus:
            bundles[0]["CPU"] = bundles[0].get("CPU", 0.0) + float(self.replica_num_cpus)
        return tuple(bundles)

    @property
    def host_label_selector(self) -> dict[str, str]:
        """Labels every host of the slice must carry (without the slice name)."""
        labels = {ACCELERATOR_TYPE_LABEL: self.slice.ray_accelerator_type}
        if self.slice.is_multi_host:
            labels[POD_TYPE_LABEL] = self.slice.pod_type
        return labels

    @property
    def bundle_label_selector(self) -> tuple[dict[str, str], ...]:
        """Per-bundle label selectors; with ``slice_name`` every bundle is pinned to that slice."""
        labels = dict(self.host_label_selector)
        if self.slice_name is not None:
            labels[SLICE_NAME_LABEL] = self.slice_name
        return tuple(dict(labels) for _ in self.bundles)

    def deployment_options(self) -> dict[str, Any]:
        """Serve deployment options for this replica (``serve.deployment(**opts)`` / ``.options``).

        Static mode: the placement group is Serve's (bundles, strategy, per-bundle label
        selectors, replica actor in bundle 0). Deferred mode: only ``ray_actor_options``; the
        replica calls ``create_slice_placement_group`` when it starts.
        """
        if self.is_deferred:
            return {"ray_actor_options": {"num_cpus": self.replica_num_cpus}}
        return {
            "placement_group_bundles": [dict(b) for b in self.bundles],
            "placement_group_strategy": self.strategy,
            "placement_group_bundle_label_selector": [dict(s) for s in self.bundle_label_selector],
            # Must be a subset of bundle 0: the replica actor runs there.
            "ray_actor_options": {"num_cpus": self.replica_num_cpus},
        }


def create_slice_placement_group(
    placement: SlicePlacement, name: str = "", head_reservation_timeout_s: float | None = 100.0
) -> SlicePlacementGroup:
    """Reserve one whole slice for ``placement`` (deferred mode) with Ray's SlicePlacementGroup.

    Blocks until the slice head is reserved (``head_reservation_timeout_s``); the returned
    handle's ``.placement_group`` is what vLLM's Ray executor must reuse
    (``parallel_config.placement_group``). Call ``.shutdown()`` on replica exit. Needs a running
    Ray cluster with TPU nodes (real, or labelled fakes in tests).
    """
    from ray.util.tpu import SlicePlacementGroup

    sl = placement.slice
    logger.info(
        "reserving a %s %s slice (%d hosts x %d chips)", sl.accelerator, sl.topology, sl.num_hosts, sl.chips_per_host
    )
    # Ray's slice bundles are per host whatever the backend (a per-chip backend packs its
    # workers into them), so one selector per host.
    user_selectors = [dict(placement.host_label_selector) for _ in range(sl.num_hosts)]
    handle = SlicePlacementGroup(
        topology=sl.topology,
        accelerator_version=sl.ray_accelerator_version,
        resources_per_bundle=placement.host_bundle | {"CPU": float(placement.num_cpus_per_host)},
        strategy="SPREAD",
        name=name,
        chips_per_vm=sl.chips_per_host,
        head_reservation_timeout_s=head_reservation_timeout_s,
        bundle_label_selector=user_selectors,
    )
    group = handle.placement_group
    logger.info(
        "slice placement group %s: bundles pinned by %s",
        None if group is None else group.id.hex(),
        handle.bundle_label_selector,
    )
    return handle


def replica_placement_group(
    placement: SlicePlacement, name: str = "", head_reservation_timeout_s: float | None = 100.0
) -> tuple[Any, SlicePlacementGroup | None]:
    """The slice placement group a starting replica hands to ``VllmEngine``, and the handle to
    shut down on exit (deferred mode only).

    Static mode: the group Serve created for this replica (the replica runs in its bundle 0).
    Deferred mode: a whole slice reserved now with ``create_slice_placement_group``. Call it
    from inside the replica actor on a TPU cluster.
    """
    if placement.is_deferred:
        handle = create_slice_placement_group(placement, name, head_reservation_timeout_s)
        return handle.placement_group, handle
    from ray.util import get_current_placement_group

    return get_current_placement_group(), None
