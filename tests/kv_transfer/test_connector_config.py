"""The ``kv_transfer`` group, ``cache.kv_offloading_size`` and the connector registry:
vLLM's keywords and dict shape, clear errors, plugins' own connectors."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.config.cache import host_memory_bytes
from minivllm.config.llm_kwargs import config_from_kwargs
from minivllm.config.store import build_config
from minivllm.config.vllm_config import VllmConfig
from minivllm.kv_transfer import KV_CONNECTORS, register_kv_connector
from minivllm.kv_transfer.shared_storage import SharedStorageConnector

BASE = ["model=opt-125m", "load.format=dummy"]
KWARGS = dict(dtype="float32", block_size=4, disable_log_stats=True, num_gpu_blocks_override=32, max_model_len=64)


def test_off_by_default():
    cfg = build_config(BASE)
    assert cfg.kv_transfer.kv_connector is None and cfg.cache.kv_offloading_size is None


def test_hydra_options_pick_a_connector(tmp_path):
    cfg = build_config([*BASE, "kv_transfer=shared_storage", "kv_transfer.kv_role=kv_consumer"])
    assert cfg.kv_transfer.kv_connector == "SharedStorageConnector" and cfg.kv_transfer.is_consumer
    assert not cfg.kv_transfer.is_producer
    cfg = build_config([*BASE, "cache.kv_offloading_size=0.5"])
    assert cfg.kv_transfer.kv_connector == "OffloadingConnector"  # the size alone picks it


def test_llm_keywords_take_vllms_dict(tmp_path):
    node = config_from_kwargs(
        "opt-125m",
        load_format="dummy",
        kv_transfer_config={
            "kv_connector": "ExampleConnector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)},
        },
        kv_offloading_size=None,
    )
    cfg = VllmConfig.from_dictconfig(node)
    assert cfg.kv_transfer.kv_connector_extra_config == {"shared_storage_path": str(tmp_path)}
    assert cfg.kv_transfer.kv_role == "kv_producer"


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["kv_transfer.kv_role=kv_sender"], "kv_transfer.kv_role='kv_sender': must be one of kv_producer"),
        (["cache.kv_offloading_size=-1"], "cache.kv_offloading_size=-1"),
        (["cache.kv_offloading_size=0"], "cache.kv_offloading_size=0"),
        ([f"cache.kv_offloading_size={2 * host_memory_bytes() / 2**30:.0f}"], "more than this host's memory"),
        (["cache.kv_offloading_backend=lmcache"], "cache.kv_offloading_backend='lmcache': must be one of native"),
        (["cache.kv_offloading_size=1", "cache.enable_prefix_caching=false"], "needs cache.enable_prefix_caching"),
        (["kv_transfer.kv_connector=OffloadingConnector"], "OffloadingConnector: needs cache.kv_offloading_size"),
        (["kv_transfer=shared_storage", "cache.kv_offloading_size=1"], "one connector at a time"),
        (["cache.kv_offloading_size=1", "kv_transfer.kv_role=kv_consumer"], "kv_role=kv_consumer: the host-memory"),
        (["kv_transfer=shared_storage", "speculative.method=draft_model", "speculative.model=x"], "draft's own KV"),
    ],
)
def test_bad_values_are_clear_errors(overrides, match):
    with pytest.raises(ValueError, match=match):
        build_config([*BASE, *overrides])


def test_an_unknown_kv_transfer_config_key_is_refused():
    with pytest.raises(
        ValueError, match="kv_transfer_config: unknown or unsupported key.*kv_rank.*known: kv_connector"
    ):
        config_from_kwargs("opt-125m", kv_transfer_config={"kv_connector": "X", "kv_rank": 0})


def test_offloading_takes_no_extra_keys():
    with pytest.raises(ValueError, match="OffloadingConnector takes no keys, got block_size"):
        config = {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": {"block_size": 4}}
        VllmConfig.from_dictconfig(
            config_from_kwargs("opt-125m", load_format="dummy", kv_offloading_size=1, kv_transfer_config=config)
        )


def test_an_unknown_connector_lists_the_known_ones(llama_dir):
    with pytest.raises(ValueError, match="kv_connector='Nope': unknown; known: ExampleConnector, OffloadingConnector"):
        LLM(str(llama_dir), kv_transfer_config={"kv_connector": "Nope"}, **KWARGS)


def test_shared_storage_needs_its_path(llama_dir):
    with pytest.raises(ValueError, match="needs kv_transfer.kv_connector_extra_config.shared_storage_path"):
        LLM(str(llama_dir), kv_transfer_config={"kv_connector": "SharedStorageConnector"}, **KWARGS)


class CountingConnector(SharedStorageConnector):
    """A plugin's connector: shared storage that counts the blocks each rank saves."""

    saved: list[int] = []

    def write(self, keys, data):
        CountingConnector.saved.append(len(keys))
        super().write(keys, data)


def test_a_registered_connector_is_found_by_name(llama_dir, tmp_path):
    """What a general plugin's register() does: ``register_kv_connector(name, cls)``."""
    torch.set_num_threads(1)
    register_kv_connector("CountingConnector", CountingConnector)
    try:
        config = {
            "kv_connector": "CountingConnector",
            "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)},
        }
        llm = LLM(str(llama_dir), kv_transfer_config=config, **KWARGS)
        out = llm.generate("def f(x):\n    return x + 1\n", SamplingParams(max_tokens=2), use_tqdm=False)[0]
        assert sum(CountingConnector.saved) == len(list(tmp_path.glob("*.kv"))) > 0
        assert len(out.prompt_token_ids) // 4 <= sum(CountingConnector.saved)
    finally:
        KV_CONNECTORS.pop("CountingConnector")


def test_the_proxy_task_wants_http_urls():
    cfg = build_config(
        [*BASE, "task=disagg_proxy", "disagg_proxy.prefill=[http://a:1]", "disagg_proxy.decode=[http://b:2]"]
    )
    assert (cfg.task.name, cfg.disagg_proxy.prefill, cfg.disagg_proxy.decode) == (
        "disagg_proxy",
        ["http://a:1"],
        ["http://b:2"],
    )
    with pytest.raises(ValueError, match=r"disagg_proxy.decode: 'b:2' is not an http\(s\) URL"):
        build_config([*BASE, "task=disagg_proxy", "disagg_proxy.decode=[b:2]"])


def _pull(host: str, port: int = 14579) -> dict:
    return {"remote_host": host, "remote_port": port, "remote_request_id": "r", "remote_block_hashes": []}


def test_a_request_pulls_only_from_producers_this_consumer_trusts():
    """kv_transfer_params come from clients: a consumer connects only to its own kv_ip host by
    default, or to the producers listed, never to an address a request names."""
    from minivllm.config.kv_transfer import KVTransferConfig

    consumer = KVTransferConfig("P2pConnector", "kv_consumer")
    consumer.check_request_params(_pull("127.0.0.1"))
    consumer.check_request_params({"do_remote_decode": True})  # no pull
    with pytest.raises(ValueError, match=r"^kv_transfer_params.remote_host=10.0.0.9:14579: not a producer"):
        consumer.check_request_params(_pull("10.0.0.9"))
    listed = KVTransferConfig(
        "P2pConnector", "kv_consumer", {"producers": ["10.0.0.9:14579", "prefill-1:15000"]}, kv_ip="10.0.0.2"
    )
    listed.check_request_params(_pull("prefill-1", 15000))
    for host, port in (("10.0.0.9", 22), ("10.0.0.2", 14579), ("127.0.0.1", 14579)):
        with pytest.raises(ValueError, match="list it in kv_transfer.kv_connector_extra_config.producers"):
            listed.check_request_params(_pull(host, port))
    with pytest.raises(ValueError, match="must be a string and an integer"):
        consumer.check_request_params(_pull("127.0.0.1", "14579"))
    with pytest.raises(ValueError, match="only a kv_consumer pulls KV"):
        KVTransferConfig("P2pConnector", "kv_producer").check_request_params(_pull("127.0.0.1"))
    with pytest.raises(ValueError, match=r"^kv_transfer_params: this engine has no KV connector"):
        KVTransferConfig().check_request_params({"do_remote_decode": True})
    with pytest.raises(ValueError, match="must be an object"):
        consumer.check_request_params(["127.0.0.1"])
    with pytest.raises(ValueError, match="producers: '10.0.0.9' is not 'host:port'"):
        KVTransferConfig("P2pConnector", "kv_consumer", {"producers": ["10.0.0.9"]})


def test_the_engine_refuses_an_untrusted_producer_before_any_work(tmp_path):
    llm = LLM(
        model="opt-125m",
        load_format="dummy",
        kv_transfer_config={"kv_connector": "P2pConnector", "kv_role": "kv_consumer"},
        **KWARGS,
    )
    try:
        params = SamplingParams(max_tokens=2, extra_args={"kv_transfer_params": _pull("169.254.169.254", 80)})
        with pytest.raises(ValueError, match="remote_host=169.254.169.254:80: not a producer"):
            llm.generate("hello", params, use_tqdm=False)
        assert not llm.llm_engine.has_unfinished_requests()
        out = llm.generate("hello", SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)[0]
        assert len(out.outputs[0].token_ids) == 2  # still serving
    finally:
        llm.shutdown()
