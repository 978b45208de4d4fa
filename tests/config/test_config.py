"""The config tree: every option composes, every _target_ instantiates, bad values
fail at build time naming the key, and the three ways in agree."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import get_class
from omegaconf import OmegaConf

from minivllm import LLM, compose
from minivllm.config import VllmConfig, build_config
from minivllm.config.llm_kwargs import config_from_kwargs
from minivllm.worker.worker import Worker

CONF = Path(__file__).resolve().parents[2] / "conf"
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in ("model", "__pycache__"))


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in _options(g)])
def test_every_option_composes_and_validates(group, option, llama_dir):
    appended = "+" if group == "tune" else ""  # the tune presets are added to the defaults list: +tune=serving
    overrides = [f"{appended}{group}={option}", f"model.path={llama_dir}"]
    if (group, option) == ("bench", "nanovllm"):  # a global preset asking for a 4,096-token context
        overrides.append("model.max_model_len=256")
    if group == "device" and option == "cuda" and not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device.type=cuda"):
            build_config(overrides)
        return
    cfg = build_config(overrides)
    assert OmegaConf.select(compose(overrides), group) is not None
    for node in (cfg.parallel.executor, cfg.parallel.worker, cfg.parallel.model_runner, cfg.load.loader):
        assert isinstance(get_class(node["_target_"]), type)


@pytest.mark.parametrize("preset", _options("model"))
def test_every_model_preset_builds_offline_with_dummy_weights(preset):
    cfg = build_config([f"model={preset}", "load.format=dummy"])
    assert cfg.architecture
    assert cfg.max_model_len > 0


def test_attention_auto_resolves_to_a_concrete_class_per_device(llama_dir):
    cfg = build_config([f"model.path={llama_dir}", "device=cpu"])
    assert cfg.attention.backend["_target_"].endswith("TorchAttentionBackend")
    assert cfg.parallel.executor["_target_"].endswith("UniProcExecutor")


@pytest.mark.parametrize(
    "requested, device, expected",
    [
        (None, "cpu", False),
        (None, "cuda", True),
        (True, "cpu", True),
        (False, "cuda", False),
    ],
)
def test_torch_compile_null_follows_the_device(requested, device, expected, llama_dir):
    from minivllm.config.device import resolve_torch_compile

    assert resolve_torch_compile(requested, device) is expected
    value = "null" if requested is None else str(requested).lower()
    if device == "cpu":  # the resolved value is what the config carries to the runner
        cfg = build_config([f"model.path={llama_dir}", "device=cpu", f"compilation.torch_compile={value}"])
        assert cfg.torch_compile is expected


def test_compose_is_callable_many_times():
    first = compose(["cache.block_size=8"])
    second = compose(["cache.block_size=32"])
    assert (first.cache.block_size, second.cache.block_size) == (8, 32)


@pytest.mark.parametrize(
    "override,key",
    [
        ("cache.block_size=12", "cache.block_size"),
        ("cache.gpu_memory_utilization=1.5", "cache.gpu_memory_utilization"),
        ("cache.gpu_memory_utilization=0", "cache.gpu_memory_utilization"),
        ("cache.gpu_memory_utilization=nan", "cache.gpu_memory_utilization"),
        ("serve.shutdown_timeout=nan", "serve.shutdown_timeout"),
        ("model.dtype=float8", "model.dtype"),
        ("parallel.tp=0", "parallel.tp"),
        ("parallel.backend=threads", "parallel.backend"),
        ("scheduler.max_num_seqs=0", "scheduler.max_num_seqs"),
        ("scheduler.policy=lifo", "scheduler.policy"),
        ("load.format=gguf", "load.format"),
        ("model.max_model_len=100000", "model.max_model_len"),
        ("model.path=/nonexistent/checkpoint", "model.path"),
    ],
)
def test_bad_values_fail_at_build_time_naming_the_key(override, key, llama_dir):
    overrides = [f"model.path={llama_dir}", override]
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        build_config(overrides)


def test_chunked_prefill_off_needs_a_budget_of_max_model_len(llama_dir):
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        build_config(
            [f"model.path={llama_dir}", "scheduler.enable_chunked_prefill=false", "scheduler.max_num_batched_tokens=16"]
        )


def test_unknown_architecture_lists_the_supported_ones(llama_dir):
    llm_kwargs = dict(dtype="float32", num_gpu_blocks_override=8, hf_overrides={"architectures": ["NopeForCausalLM"]})
    with pytest.raises(ValueError, match="NopeForCausalLM.*LlamaForCausalLM"):
        LLM(model=str(llama_dir), **llm_kwargs)


def test_llm_kwargs_and_overrides_give_the_same_tree(llama_dir):
    via_kwargs = config_from_kwargs(
        str(llama_dir),
        tensor_parallel_size=1,
        gpu_memory_utilization=0.5,
        block_size=8,
        max_num_seqs=4,
        max_num_batched_tokens=128,
        max_model_len=64,
        dtype="float32",
        seed=3,
        enforce_eager=True,
        load_format="safetensors",
        enable_prefix_caching=False,
        num_gpu_blocks_override=32,
    )
    via_overrides = compose(
        [
            f"model.path={llama_dir}",
            "model.hf_config=null",
            "parallel.tp=1",
            "cache.gpu_memory_utilization=0.5",
            "cache.block_size=8",
            "scheduler.max_num_seqs=4",
            "scheduler.max_num_batched_tokens=128",
            "model.max_model_len=64",
            "model.dtype=float32",
            "model.seed=3",
            "compilation.cudagraph=false",
            "load.format=safetensors",
            "cache.enable_prefix_caching=false",
            "cache.num_gpu_blocks_override=32",
        ]
    )
    a = VllmConfig.from_dictconfig(via_kwargs).to_dictconfig()
    b = VllmConfig.from_dictconfig(via_overrides).to_dictconfig()
    assert OmegaConf.to_container(a) == OmegaConf.to_container(b)


def test_unknown_llm_keyword_is_named():
    with pytest.raises(ValueError, match="tensor_paralel_size"):
        config_from_kwargs("opt-125m", tensor_paralel_size=2)


@pytest.mark.parametrize(
    "kwargs,start",
    [
        ({"tensor_parallel_size": 3}, "parallel.tp=3: "),
        ({"kv_cache_dtype": "int4"}, "cache.cache_dtype='int4': "),
        ({"scheduling_policy": "lifo"}, "scheduler.policy='lifo': "),
    ],
)
def test_a_bad_llm_keyword_value_names_the_keyword_too(kwargs, start):
    """The config key a keyword sets may have another name; the error names both."""
    with pytest.raises(ValueError) as err:
        LLM("demo", **kwargs)
    message = str(err.value)
    assert message.startswith(start) and message.endswith(f"(LLM keyword {next(iter(kwargs))})")


def test_a_keyword_named_as_its_key_is_not_repeated():
    with pytest.raises(ValueError) as err:
        LLM("demo", block_size=7)
    assert str(err.value).startswith("cache.block_size=7: ") and "LLM keyword" not in str(err.value)


def test_vllm_keywords_we_do_not_implement_say_what_to_do_instead():
    with pytest.raises(ValueError, match="swap_space: preemption recomputes") as err:
        config_from_kwargs("opt-125m", swap_space=16, cpu_offload_gb=2)
    assert "cpu_offload_gb: weights are never offloaded" in str(err.value)


def test_tokenizer_mode_auto_is_what_we_do_and_others_are_named():
    """vLLM scripts often spell out the default, ``tokenizer_mode="auto"``."""
    plain = OmegaConf.to_container(config_from_kwargs("opt-125m"))
    for mode in ("auto", "hf"):
        assert OmegaConf.to_container(config_from_kwargs("opt-125m", tokenizer_mode=mode)) == plain
    with pytest.raises(ValueError, match="tokenizer_mode='mistral': only 'auto'"):
        config_from_kwargs("opt-125m", tokenizer_mode="mistral")


class RecordingWorker(Worker):
    """A user's own worker class, plugged in through parallel.worker._target_."""

    instances = 0

    def __init__(self, *args, tag: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        RecordingWorker.instances += 1
        self.tag = tag


def test_a_users_own_class_replaces_a_target(llama_dir):
    llm = LLM(
        model=str(llama_dir),
        dtype="float32",
        num_gpu_blocks_override=16,
        overrides=[f"parallel.worker._target_={__name__}.RecordingWorker", "+parallel.worker.tag=mine"],
    )
    worker = llm.llm_engine.core.executor.worker
    assert isinstance(worker, RecordingWorker) and worker.tag == "mine"
    out = llm.generate("x", use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) > 0
