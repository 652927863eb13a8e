"""Session table: which replica a conversation is bound to, with an idle TTL and an in-flight cap.

A session key comes from the ``x-session-id`` header, else the OpenAI ``user`` field, else
``prompt_cache_key`` (``deployments.messages.sessions.session_id_from``). A binding is sticky: the
policy keeps routing the
session to its replica unless that replica is gone or overloaded, or the session already has
``max_in_flight_per_session`` requests there (then the extra request spills without moving the
binding — parallel calls of one agent should not pile onto one replica).

Rebalancing moves as few sessions as possible: adding a replica moves none (new sessions find it
by load), removing one unbinds only its own sessions, and an overloaded replica loses a session
only when one of that session's requests actually spills (the session then follows its newest
context). Bindings idle longer than ``ttl_s`` expire; a session with requests in flight is never
idle.

The table also counts, per replica, the sessions bound there and used within ``active_s``
(``num_active``): such a session is load that will come back (its next turn goes where it is
bound), so the policy counts it when it places a new session.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from deployments.config.router import SessionConfig


@dataclass
class _Binding:
    replica_id: str
    last_used_s: float
    num_in_flight: int = 0


class SessionTable:
    """Session key -> bound replica. Ordered by last use, so expiry pops from the front."""

    def __init__(self, config: SessionConfig, clock: Callable[[], float]) -> None:
        self._config = config
        self._clock = clock
        self._bindings: OrderedDict[str, _Binding] = OrderedDict()
        # Bound sessions used within ``active_s``, oldest use first -> their last use. Kept apart
        # from ``_bindings``' order because expiry refreshes an in-flight binding without a use.
        # Invariants: every key is bound; ``_num_active`` counts them per bound replica (absent at 0).
        self._active: OrderedDict[str, float] = OrderedDict()
        self._num_active: dict[str, int] = {}

    def __len__(self) -> int:
        self._expire()
        return len(self._bindings)

    def bound_replica(self, key: str) -> str | None:
        """The replica ``key`` is bound to, or ``None`` (unknown or expired)."""
        self._expire()
        binding = self._bindings.get(key)
        return binding.replica_id if binding is not None else None

    def num_active(self) -> Mapping[str, int]:
        """Per replica, the sessions bound there that were used within ``active_s`` (a request
        dispatched or finished): the ones likely to send another turn soon. Replicas with none are
        absent. A read-only view, valid until the table changes."""
        self._expire()
        return self._num_active

    def can_stick(self, key: str) -> bool:
        """False when the session already has the maximum number of requests in flight."""
        binding = self._bindings.get(key)
        return binding is None or binding.num_in_flight < self._config.max_in_flight_per_session

    def on_dispatched(self, key: str, replica_id: str, *, rebind: bool) -> None:
        """A request of ``key`` went to ``replica_id``. An unbound session binds there; a bound
        one moves only when ``rebind`` (its replica was overloaded, or it yielded to a replica
        holding more of its prompt), not on a cap spill."""
        binding = self._bindings.get(key)
        now_s = self._clock()
        if binding is None:
            binding = self._bindings[key] = _Binding(replica_id, now_s)
        elif rebind and binding.replica_id != replica_id:
            self._deactivate(key)
            binding.replica_id = replica_id
        binding.num_in_flight += 1
        binding.last_used_s = now_s
        self._bindings.move_to_end(key)
        self._touch(key, binding)

    def on_finished(self, key: str) -> None:
        binding = self._bindings.get(key)
        if binding is None:
            return
        binding.num_in_flight = max(0, binding.num_in_flight - 1)
        binding.last_used_s = self._clock()
        self._bindings.move_to_end(key)
        self._touch(key, binding)

    def remove_replica(self, replica_id: str) -> int:
        """Unbind the sessions of a gone replica (only those); returns how many."""
        gone = [key for key, binding in self._bindings.items() if binding.replica_id == replica_id]
        for key in gone:
            self._deactivate(key)
            del self._bindings[key]
        return len(gone)

    def _touch(self, key: str, binding: _Binding) -> None:
        """``key`` was just used (at ``binding.last_used_s``): it is (still) active."""
        if key not in self._active:
            self._num_active[binding.replica_id] = self._num_active.get(binding.replica_id, 0) + 1
        self._active[key] = binding.last_used_s
        self._active.move_to_end(key)

    def _deactivate(self, key: str) -> None:
        """Stop counting ``key`` as active (no-op if it is not); it must still be bound."""
        if self._active.pop(key, None) is not None:
            replica_id = self._bindings[key].replica_id
            n = self._num_active[replica_id] - 1
            if n:
                self._num_active[replica_id] = n
            else:
                del self._num_active[replica_id]

    def _expire(self) -> None:
        now_s = self._clock()
        active = self._active
        oldest_active_s = now_s - self._config.active_s
        while active:
            key, used_s = next(iter(active.items()))
            if used_s >= oldest_active_s:
                break
            self._deactivate(key)
        oldest_s = now_s - self._config.ttl_s
        bindings = self._bindings
        while bindings:
            key, binding = next(iter(bindings.items()))
            if binding.last_used_s >= oldest_s:
                return
            if binding.num_in_flight > 0:
                # A request still running keeps the session alive; treat now as its last use.
                binding.last_used_s = self._clock()
                bindings.move_to_end(key)
                continue
            self._deactivate(key)
            del bindings[key]
