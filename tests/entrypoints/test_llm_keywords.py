"""vLLM's constructor keywords are accepted and honoured; generation_config.json defaults."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.attention.backend import AttentionMetadata
from minivllm.config.kv_transfer import KVTransferConfig
from minivllm.config.llm_kwargs import config_from_kwargs
from minivllm.config.load import generation_defaults
from minivllm.config.model import ModelConfig
from minivllm.config.speculative import SpeculativeConfig
from minivllm.config.vllm_config import VllmConfig
from minivllm.worker.cuda_graphs import CUDAGraphRunner


@pytest.fixture(scope="module")
def with_generation_config(llama_dir, tmp_path_factory):
    """The Llama checkpoint with a generation_config.json asking for top_k=1 and 3 new tokens."""
    out = tmp_path_factory.mktemp("llama-gencfg") / "ckpt"
    shutil.copytree(llama_dir, out)
    gen = json.loads((out / "generation_config.json").read_text())
    gen.update(top_k=1, temperature=0.9, max_new_tokens=3, do_sample=True)
    (out / "generation_config.json").write_text(json.dumps(gen))
    return out


def test_generation_config_defaults_apply_without_sampling_params(with_generation_config):
    torch.set_num_threads(1)
    llm = LLM(str(with_generation_config), dtype="float32", disable_log_stats=True, num_gpu_blocks_override=128)
    defaults = llm.get_default_sampling_params()
    assert (defaults.top_k, defaults.temperature, defaults.max_tokens) == (1, 0.9, 3)
    prompts = ["def f(x):", "import os"]
    sampled = llm.generate(prompts, use_tqdm=False)  # top_k=1: sampling is greedy
    greedy = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in sampled] == [o.outputs[0].token_ids for o in greedy]
    off = VllmConfig.from_dictconfig(config_from_kwargs(str(with_generation_config), generation_config="vllm"))
    assert generation_defaults(off.model.generation_config, off.checkpoint_dir) == {}


def test_dtype_aliases():
    assert ModelConfig(dtype="half").dtype == "float16"
    assert ModelConfig(dtype="float").dtype == "float32"
    for name in ("float16", "bfloat16", "float32"):
        assert ModelConfig(dtype=name).dtype == name
    with pytest.raises(ValueError, match="model.dtype.*half"):
        ModelConfig(dtype="float8")


def _fake_hf_cache(root, repo: str, revision: str, checkpoint) -> None:
    """The HF hub cache layout: models--org--name/{refs/<rev>, snapshots/<commit>/...}."""
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(checkpoint, repo_dir / "snapshots" / commit)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / revision).write_text(commit)


def test_revision_and_download_dir_find_the_hf_cache_entry(llama_dir, tmp_path):
    _fake_hf_cache(tmp_path, "org/tiny-llama", "v1", llama_dir)
    cfg = VllmConfig.from_dictconfig(
        config_from_kwargs("org/tiny-llama", download_dir=str(tmp_path), revision="v1", tokenizer_revision="v1")
    )
    assert cfg.checkpoint_dir is not None and cfg.checkpoint_dir.parent.name == "snapshots"
    with pytest.raises(ValueError, match="revision='v2'"):
        VllmConfig.from_dictconfig(config_from_kwargs("org/tiny-llama", download_dir=str(tmp_path), revision="v2"))
    with pytest.raises(ValueError, match="no local checkpoint"):
        VllmConfig.from_dictconfig(config_from_kwargs("org/tiny-llama", revision="v1"))


def test_trust_remote_code_and_code_revision_reach_transformers(llama_dir, monkeypatch):
    from transformers import AutoConfig

    seen = {}
    real = AutoConfig.from_pretrained

    def spy(path, **kwargs):
        seen.update(kwargs)
        return real(path, **{k: v for k, v in kwargs.items() if k != "code_revision"})

    monkeypatch.setattr(AutoConfig, "from_pretrained", spy)
    VllmConfig.from_dictconfig(config_from_kwargs(str(llama_dir), trust_remote_code=True, code_revision="abc"))
    assert seen["trust_remote_code"] is True and seen["code_revision"] == "abc"


def test_other_keywords_land_on_their_keys(llama_dir):
    cfg = config_from_kwargs(
        str(llama_dir),
        served_model_name=["tiny", "alias"],
        disable_log_stats=True,
        max_seq_len_to_capture=64,
        task="embed",
    )
    assert cfg.serve.served_model_name == "tiny,alias"
    assert cfg.scheduler.log_stats_interval == 0.0
    assert cfg.compilation.max_seq_len_to_capture == 64
    assert cfg.model.runner == "pooling"
    with pytest.raises(ValueError, match="not implemented here: swap_space: preemption recomputes"):
        config_from_kwargs(str(llama_dir), swap_space=16)


@pytest.mark.parametrize(
    ("keyword", "schema", "given", "key"),
    [
        ("speculative_config", SpeculativeConfig, {"method": "ngram", "num_speculative_tokens": 2}, "speculative"),
        ("kv_transfer_config", KVTransferConfig, {"kv_connector": "SharedStorageConnector"}, "kv_transfer"),
    ],
)
def test_group_dict_keywords_take_a_dict_or_the_dataclass_and_refuse_unknown_keys(
    llama_dir, keyword, schema, given, key
):
    """``speculative_config`` and ``kv_transfer_config`` map a dict (or the group's dataclass)
    onto the group's keys; an unknown key or a non-dict is refused naming the keyword."""
    for value in (given, schema(**given)):
        cfg = config_from_kwargs(str(llama_dir), **{keyword: value})
        assert all(cfg[key][field] == item for field, item in given.items())
    with pytest.raises(ValueError, match=f"{keyword}: unknown or unsupported key\\(s\\) bogus; known: "):
        config_from_kwargs(str(llama_dir), **{keyword: {**given, "bogus": 1}})
    with pytest.raises(ValueError, match=f"{keyword}=3: must be a dict of {key}\\.\\* keys"):
        config_from_kwargs(str(llama_dir), **{keyword: 3})


def test_graphs_do_not_cover_sequences_longer_than_max_seq_len_to_capture():
    graphs = CUDAGraphRunner(None, [1, 2], max_blocks_per_seq=4, max_model_len=64, device=torch.device("cpu"))

    def decode_meta(num_reqs: int, max_seq_len: int) -> AttentionMetadata:
        seq_lens = [max_seq_len] * num_reqs
        return AttentionMetadata(
            slot_mapping=None,
            query_start_loc=None,
            seq_lens=None,
            block_tables=None,
            max_query_len=1,
            max_seq_len=max_seq_len,
            query_lens_cpu=[1] * num_reqs,
            seq_lens_cpu=seq_lens,
        )

    assert graphs.covers(decode_meta(2, 64))
    assert not graphs.covers(decode_meta(2, 65))
    assert not graphs.covers(decode_meta(3, 10))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(swap_space=4),
        dict(cpu_offload_gb=0),
        dict(cpu_offload_gb=0.0),
        dict(disable_custom_all_reduce=True),
        dict(skip_tokenizer_init=False),
        dict(hf_token=None),
        dict(model_impl="auto"),
        dict(preemption_mode="recompute"),
        dict(compilation_config=None),
    ],
)
def test_unimplemented_keywords_at_a_value_asking_for_nothing_change_nothing(kwargs, llama_dir):
    """What scripts written for vLLM spell out: the config equals the one without them."""
    assert config_from_kwargs(str(llama_dir), **kwargs) == config_from_kwargs(str(llama_dir))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(swap_space=8),
        dict(cpu_offload_gb=2),
        dict(disable_custom_all_reduce=False),
        dict(skip_tokenizer_init=True),
        dict(hf_token="hf_abc"),
        dict(model_impl="transformers"),
        dict(preemption_mode="swap"),
        dict(swap_space=True),  # a bool is not a size
    ],
)
def test_unimplemented_keywords_asking_for_something_are_refused_by_name(kwargs, llama_dir):
    (name,) = kwargs
    with pytest.raises(ValueError, match=rf"not implemented here: {name}: .*\(accepted only as None"):
        config_from_kwargs(str(llama_dir), **kwargs)
