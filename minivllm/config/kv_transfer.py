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
    """The connector's own keys (SharedStorageConnector: shared_storage_path; P2pConnector: abort_request_timeout, transfer_timeout, producers: the "host:port" of each kv_producer a kv_consumer may pull from, default any port on its own kv_ip host)."""
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
        self.producers()  # a malformed list is an error now, not at the first request

    def producers(self) -> list[tuple[str, int]] | None:
        """``kv_connector_extra_config.producers`` as (host, port) pairs; None when not given."""
        given = self.kv_connector_extra_config.get("producers")
        if given is None:
            return None
        pairs = []
        for entry in given if isinstance(given, (list, tuple)) else [given]:
            host, _, port = str(entry).rpartition(":")
            if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
                raise ValueError(
                    f"kv_transfer.kv_connector_extra_config.producers: {entry!r} is not 'host:port' "
                    "(a kv_producer's kv_ip and kv_port)"
                )
            pairs.append((host, int(port)))
        return pairs

    def check_request_params(self, params: Any) -> None:
        """A request's ``kv_transfer_params`` (``SamplingParams.extra_args``, or the OpenAI body's
        field): refused unless this engine has a connector, and a pull (``remote_host`` /
        ``remote_port``) unless this engine is a kv_consumer and the producer is one it trusts
        (``producers``, or its own ``kv_ip`` host): a client must not make the engine connect to an
        address of its choosing, nor fill the prefix cache with KV from a server of its own."""
        if params is None:
            return
        if not isinstance(params, dict):
            raise ValueError(f"kv_transfer_params: must be an object, got {type(params).__name__}")
        if not self.enabled:
            raise ValueError("kv_transfer_params: this engine has no KV connector (kv_transfer.kv_connector is null)")
        if "remote_host" not in params and "remote_port" not in params:
            return
        if not self.is_consumer:
            raise ValueError(
                f"kv_transfer_params.remote_host: this engine is a {self.kv_role}; only a kv_consumer pulls KV"
            )
        host, port = params.get("remote_host"), params.get("remote_port")
        if not isinstance(host, str) or not isinstance(port, int) or isinstance(port, bool):
            raise ValueError("kv_transfer_params.remote_host / remote_port: must be a string and an integer")
        allowed = self.producers()
        trusted = (host, port) in allowed if allowed is not None else host == self.kv_ip
        if not trusted:
            known = ", ".join(f"{h}:{p}" for h, p in allowed) if allowed is not None else f"any port on {self.kv_ip}"
            raise ValueError(
                f"kv_transfer_params.remote_host={host}:{port}: not a producer this engine pulls from ({known}); "
                "list it in kv_transfer.kv_connector_extra_config.producers"
            )

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
