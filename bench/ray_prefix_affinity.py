"""Ray Serve's ``PrefixCacheAffinityRouter`` algorithm, re-implemented from its description
(``ray/llm/_internal/serve/routing_policies/prefix_aware``; see shared/reference/ray-serve.md §5)
as a simulator peer. Not imported: ``ray.serve.llm`` needs a matching vLLM build.

Per request: if ``max_q - min_q > imbalanced_threshold`` -> power of two over all replicas.
Else match the request text against a char-level multi-tenant approximate radix tree (tenant =
replica); ``match_rate = matched_chars / text_chars``; below ``match_rate_threshold`` -> the
replicas with the smallest tree (fewest inserted chars), else the replicas holding the longest
match. Serve then probes (up to) two replicas of that group and takes the shorter queue. The
chosen replica's branch is extended with the prompt (routing history, no eviction by default).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence


class _Node:
    __slots__ = ("text", "children", "tenants")

    def __init__(self, text: str) -> None:
        self.text = text
        self.children: dict[str, _Node] = {}
        self.tenants: dict[str, float] = {}  # tenant -> last access time


def _common_prefix_len(edge: str, text: str, start: int) -> int:
    """Length of the common prefix of ``edge`` and ``text[start:]`` (binary search on slices)."""
    if text.startswith(edge, start):
        return len(edge)
    lo, hi = 0, min(len(edge), len(text) - start)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if text[start : start + mid] == edge[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class CharPrefixTree:
    """Multi-tenant radix tree over characters (Ray's ``PrefixTree``)."""

    def __init__(self) -> None:
        self.root = _Node("")
        self.char_count: dict[str, int] = {}

    def add_tenant(self, tenant: str) -> None:
        self.char_count.setdefault(tenant, 0)
        self.root.tenants.setdefault(tenant, 0.0)

    def insert(self, text: str, tenant: str, now_s: float) -> None:
        node = self.root
        node.tenants[tenant] = now_s
        i, n = 0, len(text)
        while i < n:
            child = node.children.get(text[i])
            if child is None:
                leaf = _Node(text[i:])
                leaf.tenants[tenant] = now_s
                node.children[text[i]] = leaf
                self.char_count[tenant] += n - i
                return
            k = _common_prefix_len(child.text, text, i)
            if k < len(child.text):  # split the edge at k
                mid = _Node(child.text[:k])
                mid.tenants = dict(child.tenants)
                child.text = child.text[k:]
                mid.children[child.text[0]] = child
                node.children[text[i]] = mid
                child = mid
            if tenant not in child.tenants:
                self.char_count[tenant] += k
            child.tenants[tenant] = now_s
            node, i = child, i + k

    def prefix_match(self, text: str, available: Sequence[str]) -> tuple[int, list[str]]:
        """(matched chars, available tenants holding the deepest matched node)."""
        node, i, n = self.root, 0, len(text)
        while i < n:
            child = node.children.get(text[i])
            if child is None or not any(t in child.tenants for t in available):
                break
            k = _common_prefix_len(child.text, text, i)
            i += k
            node = child
            if k < len(child.text):
                break
        return i, [t for t in available if t in node.tenants]


class RayPrefixAffinityPeer:
    """The routing algorithm; queue lengths are the caller's in-flight counts."""

    def __init__(
        self,
        replicas: Sequence[str],
        *,
        imbalanced_threshold: float = math.inf,
        match_rate_threshold: float = 0.1,
        seed: int = 0,
    ) -> None:
        self.replicas = tuple(replicas)
        self.imbalanced_threshold = imbalanced_threshold
        self.match_rate_threshold = match_rate_threshold
        self.tree = CharPrefixTree()
        for r in self.replicas:
            self.tree.add_tenant(r)
        self._rng = random.Random(seed)

    def choose(self, text: str, in_flight: Mapping[str, int]) -> str:
        queue = [in_flight[r] for r in self.replicas]
        if max(queue) - min(queue) > self.imbalanced_threshold:
            group = list(self.replicas)
        else:
            matched, tenants = self.tree.prefix_match(text, self.replicas)
            if not text or matched / len(text) < self.match_rate_threshold or not tenants:
                counts = self.tree.char_count
                smallest = min(counts[r] for r in self.replicas)
                group = [r for r in self.replicas if counts[r] == smallest]
            else:
                group = tenants
        if len(group) > 2:
            group = self._rng.sample(group, 2)
        return min(group, key=lambda r: in_flight[r])

    def on_routed(self, text: str, replica_id: str, now_s: float) -> None:
        self.tree.insert(text, replica_id, now_s)
