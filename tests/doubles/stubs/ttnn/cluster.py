"""``ttnn.cluster`` of the host-test stub (see ``ttnn/__init__.py``)."""

from __future__ import annotations

import enum


class ClusterType(enum.Enum):
    INVALID = 0
    N150 = 1
    N300 = 2
    T3K = 3
    GALAXY = 4
    TG = 5
    P100 = 6
    P150 = 7
    P150_X2 = 8
    P150_X4 = 9
    P150_X8 = 10
    SIMULATOR_WORMHOLE_B0 = 11
    SIMULATOR_BLACKHOLE = 12
    N300_2x2 = 13
    P300 = 14
    SIMULATOR_QUASAR = 15
    BLACKHOLE_GALAXY = 16
    P300_X2 = 17
    CUSTOM = 18


_cluster_type: ClusterType | None = None


def get_cluster_type() -> ClusterType:
    import ttnn

    ttnn._device_call("cluster.get_cluster_type")
    return _cluster_type or ClusterType.N150
