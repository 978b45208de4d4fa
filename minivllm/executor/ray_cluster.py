"""What the Ray executor and the Ray data-parallel replicas share: joining the Ray
instance, and reserving room for them in a placement group, or failing clearly.

A reservation is ``count`` identical bundles (one per rank, or one per replica)
placed with ``parallel.placement_strategy``. Before asking Ray, the request is
checked against the alive nodes' total resources: a job the cluster can never
hold (more ``STRICT_SPREAD`` bundles than nodes, more CPUs than it has) fails at
once, naming what it needs and what each node has. A job that fits but finds the
resources taken waits at most ``parallel.placement_timeout_s`` and then fails the
same way, with what is free now; Ray alone would wait forever.
"""

from __future__ import annotations

import threading
from typing import Any

Bundle = dict[str, float]


def import_ray(field: str = "parallel.backend=ray") -> Any:
    try:
        import ray
    except ImportError:
        raise ValueError(f"{field}: Ray is not installed; pip install 'minivllm[ray]'") from None
    return ray


def node_of_this_process() -> tuple[str, str]:
    """(Ray node id, node IP) of the calling actor."""
    import ray

    return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()


def first_line(err: BaseException) -> str:
    """The first non-blank line of an error (Ray's carry a traceback after it)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def reserve(ray: Any, bundle: Bundle, count: int, strategy: str, timeout_s: float, what: str) -> Any:
    """A ready placement group of ``count`` copies of ``bundle``; ValueError when the cluster
    can never hold them, RuntimeError when it has no room within ``timeout_s``."""
    from ray.util.placement_group import placement_group, remove_placement_group

    nodes = _alive_nodes(ray)
    need = f"{count} bundle(s) of {_fmt(bundle)} placed {strategy}"
    problem = why_infeasible(bundle, count, strategy, list(nodes.values()))
    if problem is not None:
        raise ValueError(
            f"{what}: the Ray cluster can never hold {need}: {problem} (nodes: {_fmt_nodes(nodes)}); "
            "add nodes or resources, or lower the parallel sizes"
        )
    group = placement_group([dict(bundle) for _ in range(count)], strategy=strategy)
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        raise RuntimeError(
            f"{what}: the Ray cluster has had no room for {need} for {timeout_s:g} s "
            f"(parallel.placement_timeout_s); free now: {_fmt(ray.available_resources())}; "
            f"nodes: {_fmt_nodes(nodes)}"
        ) from None
    return group


def bundle_nodes(group: Any) -> list[str]:
    """The node id each bundle of a ready group sits on, in bundle order."""
    from ray.util.placement_group import placement_group_table

    placed = placement_group_table(group)["bundles_to_node_id"]
    return [placed[i] for i in sorted(placed)]


def why_infeasible(bundle: Bundle, count: int, strategy: str, nodes: list[Bundle]) -> str | None:
    """Why ``count`` bundles can never fit nodes of these total resources; None if they can."""
    fits = [_fits(bundle, node) for node in nodes]
    if strategy == "STRICT_SPREAD" and sum(f > 0 for f in fits) < count:
        return f"STRICT_SPREAD puts each bundle on its own node, and only {sum(f > 0 for f in fits)} node(s) fit one"
    if strategy == "STRICT_PACK" and max(fits, default=0) < count:
        return f"STRICT_PACK puts every bundle on one node, and the largest fits {max(fits, default=0)}"
    if sum(fits) < count:
        return f"all nodes together fit {sum(fits)}"
    return None


def _fits(bundle: Bundle, node: Bundle) -> int:
    """How many copies of ``bundle`` a node of these resources holds."""
    counts = [int(node.get(key, 0.0) // amount) for key, amount in bundle.items() if amount > 0]
    return min(counts) if counts else 1 << 30


def _alive_nodes(ray: Any) -> dict[str, Bundle]:
    return {n["NodeID"]: dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")}


def _fmt(resources: dict[str, float]) -> str:
    shown = {k: v for k, v in resources.items() if k in ("CPU", "GPU") or not (k.startswith("node:") or "memory" in k)}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(shown.items())) + "}"


def _fmt_nodes(nodes: dict[str, Bundle]) -> str:
    return ", ".join(f"{node_id[:8]} {_fmt(res)}" for node_id, res in nodes.items()) or "none alive"


class RayInstance:
    """Counts the users (executors, replicas) of the Ray instance; one started here is
    shut down (with its daemons) when the last of them is. Joins the instance already
    initialised in the process, else the cluster named by ``RAY_ADDRESS``, else starts one."""

    _lock = threading.Lock()
    _users = 0
    _started_here = False

    @classmethod
    def acquire(cls, ray: Any) -> None:
        with cls._lock:
            if not ray.is_initialized():
                ray.init(include_dashboard=False, log_to_driver=True)  # RAY_ADDRESS, if set, names a cluster
                cls._started_here = True
            cls._users += 1

    @classmethod
    def release(cls, ray: Any) -> None:
        with cls._lock:
            cls._users = max(0, cls._users - 1)
            if cls._users == 0 and cls._started_here:
                ray.shutdown()
                cls._started_here = False
