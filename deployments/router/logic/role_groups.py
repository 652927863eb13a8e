"""Each served model's replicas grouped by role (``both``, ``prefill``, ``decode``): the candidates
a routing decision chooses among. A group spans every pool of that model and role (unlike a
deployment pool, one ``PoolConfig``), sorted by replica id so that candidates come in one order in
every router replica (decisions are a deterministic function of the state), and kept as a set too
for the membership tests of every decision."""

from __future__ import annotations

from collections.abc import Iterable

from deployments.config.app import Role

GroupKey = tuple[str, Role]  # (model, role)


class RoleGroups:
    def __init__(self) -> None:
        self._ordered: dict[GroupKey, tuple[str, ...]] = {}  # sorted replica ids; no empty group
        self._sets: dict[GroupKey, frozenset[str]] = {}

    def add(self, key: GroupKey, replica_id: str) -> None:
        self._set(key, self._ordered.get(key, ()) + (replica_id,))

    def discard(self, key: GroupKey, replica_id: str) -> None:
        self._set(key, (r for r in self._ordered.get(key, ()) if r != replica_id))

    def members(self, key: GroupKey) -> tuple[str, ...] | None:
        """The group's replicas in order; None = no replica has that model and role."""
        return self._ordered.get(key)

    def member_set(self, key: GroupKey, allowed: frozenset[str] | None = None) -> frozenset[str]:
        """The group's replicas (those in ``allowed`` when given); the group must exist."""
        members = self._sets[key]
        return members if allowed is None else members & allowed

    def by_role(
        self, model: str, allowed: frozenset[str] | None
    ) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None, tuple[str, ...] | None]:
        """The replicas of ``model`` by role: (prefill, decode, both); None = no such role. With
        ``allowed`` (a pinned pool or a retry): no disaggregation, only those replicas."""
        prefill = self._ordered.get((model, "prefill"))
        decode = self._ordered.get((model, "decode"))
        both = self._ordered.get((model, "both"))
        if allowed is None:
            return prefill, decode, both
        return None, tuple(r for r in decode or () if r in allowed), tuple(r for r in both or () if r in allowed)

    def _set(self, key: GroupKey, members: Iterable[str]) -> None:
        ordered = tuple(sorted(members))
        if ordered:
            self._ordered[key], self._sets[key] = ordered, frozenset(ordered)
        else:
            self._ordered.pop(key, None)
            self._sets.pop(key, None)
