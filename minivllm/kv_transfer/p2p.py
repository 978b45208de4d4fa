"""Disaggregated prefill point to point (vLLM's ``P2pNcclConnector``): the decode engine
pulls a request's prompt KV from the prefill engine that computed it, over torch.distributed.

::

    prefill engine (kv_role: kv_producer)               decode engine (kv_role: kv_consumer)
    step computes the prompt: save_kv stages its
      full blocks' rows in host memory, per request
    the request finishes: RequestOutput.kv_transfer_params ──(the caller, or the proxy)──┐
      remote_host/port/engine_id, remote_request_id,                                     │
      remote_block_hashes, remote_tp_size                  SamplingParams.extra_args     v
                                                             ["kv_transfer_params"]
                                                           admission: the blocks past the
                                                             device's hits whose hashes match
    rank r serves on kv_port + r  <── pull(request id, block indices) ── start_load_kv, rank r
                                  ── rows: StatelessGroup send ──> recv ──> scatter into the
                                                                             request's blocks
    staged rows freed once pulled (or after abort_request_timeout seconds)

Control messages are JSON lines over TCP (a pull: a request id and block indices; the
reply: ok and the row width, or why not); the bytes travel over a ``StatelessGroup``
of two members (the producer's rank is member 0): gloo with CPU tensors, NCCL with
CUDA ones, made once per pair of ranks on the first pull. With tensor parallelism on
both sides (the same size), consumer rank r pulls rank r's shard from producer rank r.

The producer stages copies (host memory, outside the KV cache), so its blocks return
to its own prefix cache at once; a request aborted before a pull, or never pulled,
leaves its rows until the timeout. The hashes in the params name the producer's model,
dtypes, adapter and whole prefix (``core/block_hash.py``): a consumer loads a block
only where its own hash is the same, so a prompt or model that differs is computed
locally. A pulled request is never pulled again (preempted later, it recomputes or
hits its own prefix cache).
"""

from __future__ import annotations

import json
import logging
import socket
import socketserver
import threading
import time
from typing import TYPE_CHECKING, Any, Literal

import torch

from minivllm.distributed.parallel_state import tp_rank
from minivllm.distributed.stateless_group import StatelessGroup
from minivllm.distributed.utils import get_open_port
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.kv_transfer.connector import BlockTransfer, KVConnector, KVConnectorMetadata
from minivllm.request import Request, RequestId

if TYPE_CHECKING:
    from minivllm.config.vllm_config import VllmConfig

logger = logging.getLogger(__name__)

EXTRA_KEYS = {"abort_request_timeout": 480.0, "transfer_timeout": 60.0}
"""``kv_connector_extra_config`` keys and defaults (seconds): how long a producer keeps a
request's staged rows that nobody pulled; how long a pull (or a group's start) may take."""


def transfer_params(request: Request) -> dict[str, Any] | None:
    """The ``kv_transfer_params`` the request was given (``SamplingParams.extra_args``)."""
    extra = request.sampling_params.extra_args
    return extra.get("kv_transfer_params") if extra else None


class P2pConnector(KVConnector):
    """Producer: stages each request's computed blocks and serves them; consumer: pulls them.
    Load keys are ``(host, port, remote request id, block index)``; save keys block indices."""

    def __init__(self, cfg: VllmConfig, role: Literal["scheduler", "worker"], kv_spec: KVCacheSpec) -> None:
        super().__init__(cfg, role, kv_spec)
        kvt = cfg.kv_transfer
        name = kvt.kv_connector
        unknown = sorted(set(kvt.kv_connector_extra_config) - set(EXTRA_KEYS) - {"producers"})
        if unknown:
            raise ValueError(
                f"kv_transfer.kv_connector_extra_config: unknown key(s) {', '.join(unknown)} for {name}; "
                f"known: {', '.join(EXTRA_KEYS)}, producers"
            )
        opts = {**EXTRA_KEYS, **kvt.kv_connector_extra_config}
        for key in EXTRA_KEYS:
            if not isinstance(opts[key], (int, float)) or opts[key] <= 0:
                raise ValueError(f"kv_transfer.kv_connector_extra_config.{key}={opts[key]!r}: must be seconds > 0")
        if kvt.kv_role == "kv_both":
            raise ValueError(f"kv_transfer.kv_connector={name}: kv_role must be kv_producer or kv_consumer")
        self.abort_timeout, self.transfer_timeout = (
            float(opts["abort_request_timeout"]),
            float(opts["transfer_timeout"]),
        )
        self.host, self.port = kvt.kv_ip, kvt.kv_port
        # scheduler half (consumer)
        self._pulled: set[RequestId] = set()
        """Requests whose blocks were pulled (a later admission does not pull again)."""
        # worker half
        self._staged: dict[RequestId, tuple[float, dict[int, torch.Tensor]]] = {}
        """Producer: request -> (when last staged, block index -> its (kv_bytes_per_block,) row)."""
        self._lock = threading.Lock()
        self._server: socketserver.ThreadingTCPServer | None = None
        self._links: dict[tuple[str, int], _Link] = {}
        """Consumer: (producer host, rank's port) -> the open connection."""

    # ---- scheduler half ---------------------------------------------------------------
    def _matched_blocks(self, request: Request, num_computed_tokens: int) -> tuple[dict[str, Any], int, int] | None:
        """(params, first block, end block) of the blocks the request can pull; None for none."""
        params = transfer_params(request)
        if not params or "remote_host" not in params or request.request_id in self._pulled:
            return None
        if request.sampling_params.prompt_logprobs is not None:
            return None
        if params.get("remote_tp_size") != self.tp or params.get("remote_block_size") != self.block_size:
            logger.warning(
                "Request %s: its KV was computed with tp=%s, block_size=%s; this engine has tp=%d, "
                "block_size=%d: computing the prompt here",
                request.request_id, params.get("remote_tp_size"), params.get("remote_block_size"), self.tp,
                self.block_size,
            )  # fmt: skip
            return None
        remote, hashes = params.get("remote_block_hashes") or [], request.block_hashes
        start = num_computed_tokens // self.block_size
        end = start
        for i in range(start, min(len(remote), len(hashes), (request.num_tokens - 1) // self.block_size)):
            if hashes[i].hex() != remote[i]:
                break
            end = i + 1
        return (params, start, end) if end > start else None

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int:
        if not self.loads_kv:
            return 0
        matched = self._matched_blocks(request, num_computed_tokens)
        return 0 if matched is None else (matched[2] - matched[1]) * self.block_size

    def update_state_after_alloc(
        self, request: Request, block_ids: list[int], num_computed_tokens: int, num_external_tokens: int
    ) -> None:
        req_id = request.request_id
        if self.saves_kv:  # every full block goes to the consumer, the device's own hits too
            self._num_saved[req_id] = 0
            return
        self.num_queried_tokens += request.num_tokens - num_computed_tokens
        n = num_external_tokens // self.block_size
        if not n:
            return
        params, start, _ = self._matched_blocks(request, num_computed_tokens)
        source = (params["remote_host"], int(params["remote_port"]), str(params["remote_request_id"]))
        self._loads[req_id] = [(block_ids[i], (*source, i)) for i in range(start, start + n)]
        self._pulled.add(req_id)
        self.num_loaded_tokens += num_external_tokens

    def reserve_block(self, request: Request, index: int) -> int:
        return index

    def request_finished(self, request: Request) -> dict[str, Any] | None:
        num_saved = self._num_saved.get(request.request_id, 0)
        super().request_finished(request)
        self._pulled.discard(request.request_id)
        if not self.saves_kv or not num_saved:
            return None
        return {
            "remote_host": self.host,
            "remote_port": self.port,
            "remote_engine_id": f"{self.host}:{self.port}",
            "remote_request_id": request.request_id,
            "remote_block_hashes": [h.hex() for h in request.block_hashes[:num_saved]],
            "remote_block_size": self.block_size,
            "remote_tp_size": self.tp,
        }

    # ---- worker half: producer --------------------------------------------------------
    def register_kv_caches(self, kv_caches: list[torch.Tensor], block_dim: int) -> None:
        super().register_kv_caches(kv_caches, block_dim)
        if self.saves_kv and self._server is None:
            self.device = kv_caches[0].device
            address = (self.host, self.port + tp_rank())
            try:
                self._server = _Server(address, _Serve)
            except OSError as err:
                raise RuntimeError(
                    f"kv_transfer: a kv_producer serves its KV on kv_ip:kv_port + tp rank = {address[0]}:{address[1]}, "
                    f"which cannot be bound ({err}); give another kv_transfer.kv_port (or kv_ip)"
                ) from err
            self._server.connector = self
            threading.Thread(target=self._server.serve_forever, name="kv-p2p-server", daemon=True).start()

    def save_kv(self, meta: KVConnectorMetadata) -> None:
        now = time.monotonic()
        staged = {}
        for req_id, transfers in meta.saves.items():
            rows = self.gather([b for b, _ in transfers]).cpu()  # (n, bytes), a copy
            staged[req_id] = {index: row for (_, index), row in zip(transfers, rows)}
        with self._lock:
            for req_id, rows in staged.items():
                self._staged.setdefault(req_id, (now, {}))[1].update(rows)
                self._staged[req_id] = (now, self._staged[req_id][1])
            expired = [r for r, (t, _) in self._staged.items() if now - t > self.abort_timeout]
            for req_id in expired:
                del self._staged[req_id]
        if expired:
            logger.warning("KV of %d request(s) not pulled in %.0f s: dropped", len(expired), self.abort_timeout)

    def take_staged(self, req_id: str, blocks: list[int]) -> torch.Tensor | str:
        """Producer's server: the rows of ``blocks`` of ``req_id``, (n, kv_bytes_per_block) uint8,
        its staged copy freed; or why not."""
        with self._lock:
            entry = self._staged.get(req_id)
            if entry is None:
                return f"request {req_id}: no KV staged here (never computed, pulled already, or timed out)"
            missing = [b for b in blocks if b not in entry[1]]
            if missing:
                return f"request {req_id}: blocks {missing} not staged here"
            del self._staged[req_id]
        return torch.stack([entry[1][b] for b in blocks])

    def send_rows(self, group: StatelessGroup, rows: torch.Tensor) -> None:
        """Producer's server: a pull's rows to the consumer (member 1), after its ok."""
        group.send(rows.to(self.device), 1)

    def num_staged(self) -> int:
        """Requests whose rows wait to be pulled (producer)."""
        with self._lock:
            return len(self._staged)

    # ---- worker half: consumer --------------------------------------------------------
    def load_blocks(self, req_id: RequestId, transfers: list[BlockTransfer]) -> int:
        """Pull the request's blocks in one transfer: all of them, or none (logged)."""
        host, port, remote_id, _ = transfers[0][1]
        try:
            rows = self._pull(host, port + tp_rank(), remote_id, [key[3] for _, key in transfers])
        except RuntimeError as err:
            logger.warning("Request %s: %s; its prompt is computed here", req_id, err)
            return 0
        self.scatter([b for b, _ in transfers], rows)
        return len(transfers)

    def _pull(self, host: str, port: int, req_id: str, blocks: list[int]) -> torch.Tensor:
        """(n, kv_bytes_per_block) uint8 on this rank's device: the blocks' rows from the producer."""
        link = self._links.get((host, port))
        try:
            if link is None:
                link = self._links[(host, port)] = _Link.open(host, port, self._layers[0].device, self.transfer_timeout)
            reply = link.ask({"op": "pull", "request_id": req_id, "blocks": blocks})
        except (OSError, ValueError) as err:  # the producer is gone (or never was)
            self._drop_link(host, port)
            raise RuntimeError(f"KV pull of request {req_id} from {host}:{port} failed: {err}") from err
        if not reply.get("ok"):
            raise RuntimeError(f"KV pull of request {req_id} from {host}:{port} refused: {reply.get('error')}")
        if reply["width"] != self.kv_bytes_per_block:
            self._drop_link(host, port)  # the rows still come: the link is out of step
            raise RuntimeError(f"KV pull from {host}:{port}: a block there is {reply['width']} bytes, "
                               f"here {self.kv_bytes_per_block}")  # fmt: skip
        rows = torch.empty((len(blocks), self.kv_bytes_per_block), dtype=torch.uint8, device=link.device)
        try:
            link.group.recv(rows, 0)
        except RuntimeError as err:  # the producer died mid-transfer
            self._drop_link(host, port)
            raise RuntimeError(f"KV pull of request {req_id} from {host}:{port} failed: {err}") from err
        return rows.to(self._layers[0].device)

    def _drop_link(self, host: str, port: int) -> None:
        link = self._links.pop((host, port), None)
        if link is not None:
            link.sock.close()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    connector: P2pConnector


class _Serve(socketserver.StreamRequestHandler):
    """One consumer rank's connection: a group of two on its hello, then its pulls in turn."""

    def handle(self) -> None:
        connector: P2pConnector = self.server.connector
        device = connector.device
        if device.type == "cuda":
            torch.cuda.set_device(device)
        group = None
        for line in self.rfile:
            message = json.loads(line)
            if message["op"] == "hello":
                store_port = get_open_port(connector.host)
                self._reply({"ok": True, "store_port": store_port, "backend": device.type})
                group = StatelessGroup.create(
                    connector.host, store_port, 0, 2, device, timeout_s=connector.transfer_timeout
                )
                continue
            rows = connector.take_staged(message["request_id"], message["blocks"])
            if isinstance(rows, str):
                self._reply({"ok": False, "error": rows})
                continue
            self._reply({"ok": True, "width": rows.shape[1]})
            connector.send_rows(group, rows)

    def _reply(self, message: dict[str, Any]) -> None:
        self.wfile.write(json.dumps(message).encode() + b"\n")
        self.wfile.flush()


class _Link:
    """A consumer rank's connection to one producer rank: the control socket and the group."""

    def __init__(self, sock: socket.socket, file: Any, group: StatelessGroup, device: torch.device) -> None:
        self.sock, self.file, self.group, self.device = sock, file, group, device

    @classmethod
    def open(cls, host: str, port: int, device: torch.device, timeout_s: float) -> _Link:
        sock = socket.create_connection((host, port), timeout=timeout_s)
        file = sock.makefile("rwb")
        file.write(b'{"op": "hello"}\n')
        file.flush()
        reply = json.loads(file.readline() or b"{}")
        if not reply.get("ok"):
            sock.close()
            raise ConnectionError("the producer did not answer the hello")
        group_device = device if reply["backend"] == "cuda" else torch.device("cpu")
        group = StatelessGroup.create(host, reply["store_port"], 1, 2, group_device, timeout_s=timeout_s)
        return cls(sock, file, group, group_device)

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        self.file.write(json.dumps(message).encode() + b"\n")
        self.file.flush()
        line = self.file.readline()
        if not line:
            raise ConnectionError("the producer closed the connection")
        return json.loads(line)
