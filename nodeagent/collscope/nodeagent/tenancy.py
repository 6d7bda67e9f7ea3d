"""Job owners limited to their own namespace: which namespace each named workload is in.

``auth.py`` authorizes node-wide (the operator, Prometheus). A caller refused node-wide may
still be allowed for its own namespace's pods: a request that names workloads (``workloads=``,
the pod uids of ``api.RankInfo.workload``) is then allowed when RBAC allows the same virtual
resource in the namespace of every workload it names (a RoleBinding there, ``server.py``).

That namespace must be one the tenant cannot write. The ring header's ``pod_namespace`` is
written by the tenant (any value at all), so it is never used. The workload is the pod uid
taken from the path the kubelet made (``discovery.workload_of``), and the API server says which
namespace that pod is in. ``Pods`` lists the node's pods once (``PodLister.node_pods``: a
``fieldSelector`` on ``spec.nodeName``, metadata only) and keeps uid -> namespace/name. A uid
it does not know makes it list again, at most every ``min_refresh_s``, so a caller that names
made-up uids costs the API server one list per interval, not one per request. A uid still
unknown after that (a ring outside any pod, ``dir-...``, or a pod of another node) has no
namespace: it is refused. A pod's uid never changes namespace, so entries never go stale in a
way that matters; each list replaces the whole map, which drops deleted pods. A list that
fails is ``errors.ReviewUnavailable`` (503, as a review that fails), never a refusal.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Protocol, runtime_checkable

# A pod created a moment ago is found by the next list; a flood of unknown uids lists once per
# interval per node (a 1,000-node cluster under such a flood: 500 lists/s at most).
MIN_REFRESH_S: Final = 2.0


@dataclasses.dataclass(frozen=True, slots=True)
class PodRef:
    """Where a pod lives, as the API server has it."""

    namespace: str
    name: str


@runtime_checkable
class PodLister(Protocol):
    """The pods bound to a node, by uid (``auth.KubeReviewer``; fakes in tests). Raises
    ``errors.ReviewUnavailable`` when the API server gave no answer."""

    async def node_pods(self, node: str) -> Mapping[str, PodRef]: ...


class Pods:
    """uid -> ``PodRef`` of ``node``'s pods from ``lister``, listed again on an unknown uid
    (module docstring). Concurrent lists share one call."""

    def __init__(
        self,
        lister: PodLister,
        node: str,
        *,
        min_refresh_s: float = MIN_REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lister, self.node = lister, node
        self._min_refresh_s = min_refresh_s
        self._clock = clock
        self._pods: Mapping[str, PodRef] = {}
        self._listed_at: float | None = None
        self._listing: asyncio.Future[Mapping[str, PodRef]] | None = None
        self.lists = 0

    async def lookup(self, workloads: Sequence[str]) -> dict[str, PodRef | None]:
        """Each workload's pod, None for one the API server does not place on this node."""
        if any(w not in self._pods for w in workloads) and self._may_list():
            await self._list()
        return {w: self._pods.get(w) for w in workloads}

    def _may_list(self) -> bool:
        if self._listing is not None:
            return True
        return self._listed_at is None or self._clock() - self._listed_at >= self._min_refresh_s

    async def _list(self) -> None:
        if self._listing is None:
            self._listed_at = self._clock()
            self.lists += 1
            self._listing = asyncio.ensure_future(self.lister.node_pods(self.node))
        listing = self._listing
        try:
            self._pods = dict(await asyncio.shield(listing))
        except BaseException:
            self._listed_at = None  # no answer is not "no such pod": the next request asks again
            raise
        finally:
            if self._listing is listing and listing.done():
                self._listing = None
