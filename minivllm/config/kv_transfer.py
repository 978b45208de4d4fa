"""The ``kv_transfer`` group (vLLM's ``kv_transfer_config``): which KV connector moves KV
blocks in and out of the engine's paged cache, and in which role.

Off by default (``kv_connector: null``). The connector is looked up by name when the
engine starts (``minivllm/kv_transfer/``): the built-in ones, or one a plugin registered;
an unknown name is an error there, listing the known ones (this schema cannot see
plugins). ``cache.kv_offloading_size`` alone picks ``OffloadingConnector``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from minivllm.config.model import check_choice

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")


@dataclass
class KVTransferConfig:
    """A KV connector: a seam through which KV blocks are saved after the step that computed
    them and loaded before the step that would have computed them."""

    kv_connector: Optional[str] = None
    """Connector name: null (off), SharedStorageConnector (= ExampleConnector), P2pConnector (= P2pNcclConnector), OffloadingConnector, or a plugin's."""
    kv_role: str = "kv_both"
    """kv_producer (saves only), kv_consumer (loads only) or kv_both."""
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    """The connector's own keys (SharedStorageConnector: shared_storage_path; P2pConnector: abort_request_timeout, transfer_timeout)."""
    kv_ip: str = "127.0.0.1"
    """P2pConnector: the address a kv_producer serves its KV on (given to consumers in kv_transfer_params)."""
    kv_port: int = 14579
    """P2pConnector: a kv_producer's first port; tensor-parallel rank r listens on kv_port + r."""

    def __post_init__(self) -> None:
        check_choice("kv_transfer.kv_role", self.kv_role, KV_ROLES)
        if self.kv_connector is not None and not self.kv_connector:
            raise ValueError("kv_transfer.kv_connector='': give a connector name, or null for none")
        if not isinstance(self.kv_port, int) or not 1 <= self.kv_port <= 65535:
            raise ValueError(f"kv_transfer.kv_port={self.kv_port!r}: must be a port in [1, 65535]")
        if not self.kv_ip:
            raise ValueError("kv_transfer.kv_ip='': give the address a kv_producer serves its KV on")

    @property
    def enabled(self) -> bool:
        return self.kv_connector is not None

    @property
    def is_producer(self) -> bool:
        """Whether this engine saves KV through the connector."""
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_consumer(self) -> bool:
        """Whether this engine loads KV through the connector."""
        return self.kv_role in ("kv_consumer", "kv_both")
