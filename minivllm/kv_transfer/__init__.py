"""KV connectors: KV blocks that move in and out of the engine's paged cache (``kv_transfer``).

A connector has two halves, as vLLM's ``KVConnectorBase_V1`` (``connector.py``): one beside
the scheduler, which decides which blocks are loaded and saved in a step, and one in each
worker, which copies them. Connectors are found by name in ``KV_CONNECTORS``; a plugin
(``minivllm.general_plugins``) adds its own with ``register_kv_connector``. Built in:

- ``OffloadingConnector`` (``offloading.py``): the prefix cache's host-memory tier
  (``cache.kv_offloading_size``).
- ``SharedStorageConnector``, also named ``ExampleConnector`` as in vLLM (``shared_storage.py``):
  disaggregated prefill through a directory that producer and consumer engines share.
- ``P2pConnector``, also named ``P2pNcclConnector`` as in vLLM (``p2p.py``): disaggregated
  prefill point to point, the decode engine pulling a request's KV from the prefill engine
  over torch.distributed (gloo on the CPU, NCCL on CUDA).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Literal

from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.plugins import load_general_plugins

if TYPE_CHECKING:
    from minivllm.config.vllm_config import VllmConfig
    from minivllm.kv_transfer.connector import KVConnector

KV_CONNECTORS: dict[str, str | type] = {
    "OffloadingConnector": "minivllm.kv_transfer.offloading:OffloadingConnector",
    "SharedStorageConnector": "minivllm.kv_transfer.shared_storage:SharedStorageConnector",
    "ExampleConnector": "minivllm.kv_transfer.shared_storage:SharedStorageConnector",
    "P2pConnector": "minivllm.kv_transfer.p2p:P2pConnector",
    "P2pNcclConnector": "minivllm.kv_transfer.p2p:P2pConnector",
}
"""Connector name -> its class, or ``"module:Class"`` imported on first use."""


def register_kv_connector(name: str, connector: str | type) -> None:
    """Make ``kv_transfer.kv_connector=name`` build ``connector`` (a ``KVConnector`` subclass,
    or ``"module:Class"``). Called by plugins; a name registered again is replaced."""
    KV_CONNECTORS[name] = connector


def make_kv_connector(cfg: VllmConfig, role: Literal["scheduler", "worker"], kv_spec: KVCacheSpec) -> KVConnector:
    """The ``role`` half of the connector ``kv_transfer.kv_connector`` names. Plugins are
    called first (once per process), so a connector they register is found."""
    load_general_plugins(cfg.plugins)
    name = cfg.kv_transfer.kv_connector
    target = KV_CONNECTORS.get(name)
    if target is None:
        raise ValueError(f"kv_transfer.kv_connector={name!r}: unknown; known: {', '.join(sorted(KV_CONNECTORS))}")
    if isinstance(target, str):
        module, _, cls_name = target.partition(":")
        target = getattr(importlib.import_module(module), cls_name)
    return target(cfg, role, kv_spec)
