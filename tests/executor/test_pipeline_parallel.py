"""Pipeline parallelism: pp=2 (and tp=2 x pp=2) gives pp=1's tokens; each stage holds
only its layers' weights and KV cache (the embeddings on the first stage, the final
norm and LM head on the last); a killed stage fails the engine fast; bad partitions
fail when the config is built."""

from __future__ import annotations

import math

import pytest
from safetensors import safe_open

from minivllm import LLM
from minivllm.config.parallel import check_partition, even_partition
from minivllm.executor.multiproc import MultiprocExecutor
from minivllm.models.llama import LlamaForCausalLM
from minivllm.models.registry import ModelRegistry
from tests.executor import tp_helpers as h
from tests.model_configs import gpt2_config, gpt_neox_config, llama_config


def layer_types(model) -> list[str]:
    """Runs in each worker (apply_model): the class of each decoder layer slot."""
    stack = getattr(model.model, "decoder", None) or model.model
    return [type(layer).__name__ for layer in stack.layers]


def kv_layers(worker) -> int:
    return len(worker.model_runner.kv_caches)


def param_numels(model) -> dict[str, int]:
    return {name: p.numel() for name, p in model.named_parameters()}


def checkpoint_numels(ckpt) -> dict[str, int]:
    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        return {name: math.prod(f.get_slice(name).get_shape()) for name in f.keys()}


@pytest.fixture(scope="module")
def llama3_dir(make_checkpoint):
    """An odd number of layers (GQA: 4 query heads over 2 KV heads)."""
    return make_checkpoint("llama-3-layers", llama_config(num_hidden_layers=3))


def test_even_partition_gives_the_remainder_to_the_first_stages():
    assert even_partition(3, 2) == [2, 1]
    assert even_partition(7, 3) == [3, 2, 2]
    assert check_partition(3, 2, [1, 2]) == [1, 2]


@pytest.mark.parametrize(
    "partition, pp, match",
    [([2, 2], 2, r"summing to the model's 3 decoder layers"), ([3], 2, r"needs 2 entries"), ([3, 0], 2, "at least 1")],
)
def test_a_bad_partition_is_refused(partition, pp, match):
    with pytest.raises(ValueError, match=r"parallel.pp_layer_partition=.*" + match):
        check_partition(3, pp, partition)


def test_bad_pipeline_configs_fail_when_built(llama3_dir):
    with pytest.raises(ValueError, match=r"parallel.pp=4: the model has only 3 decoder layers"):
        LLM(model=str(llama3_dir), pipeline_parallel_size=4, **h.LLM_KWARGS)
    with pytest.raises(ValueError, match=r"parallel.pp_layer_partition=\[1, 1\]"):
        LLM(
            model=str(llama3_dir),
            pipeline_parallel_size=2,
            overrides=["parallel.pp_layer_partition=[1,1]"],
            **h.LLM_KWARGS,
        )
    with pytest.raises(ValueError, match=r"parallel.pp=2: needs parallel.backend auto, mp or ray \(not uni\)"):
        LLM(model=str(llama3_dir), pipeline_parallel_size=2, distributed_executor_backend="uni", **h.LLM_KWARGS)


class NoStagesLlama(LlamaForCausalLM):
    """An out-of-tree class that builds every layer on every rank (no ``supports_pp``)."""

    supports_pp = False


def test_a_model_class_without_stages_is_refused_before_any_worker_starts(llama3_dir, monkeypatch):
    monkeypatch.setitem(ModelRegistry._models, "NoStagesLlama", NoStagesLlama)

    def no_workers(*args, **kwargs):
        raise AssertionError("workers were started")

    monkeypatch.setattr(MultiprocExecutor, "__init__", no_workers)
    with pytest.raises(ValueError, match=r"parallel.pp=2: NoStagesLlama does not support pipeline parallelism"):
        LLM(
            model=str(llama3_dir),
            pipeline_parallel_size=2,
            overrides=["model.architecture=NoStagesLlama"],
            **h.LLM_KWARGS,
        )


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_opt_pp2_matches_pp1_each_stage_holding_its_layers_and_a_killed_stage_fails_fast(opt_dir):
    llm = LLM(model=str(opt_dir), pipeline_parallel_size=2, **h.LLM_KWARGS)
    try:
        h.assert_same_outputs(h.reference(opt_dir), h.generate(llm))
        assert llm.apply_model(layer_types) == [
            ["OPTDecoderLayer", "MissingLayer"],
            ["MissingLayer", "OPTDecoderLayer"],
        ]
        assert llm.collective_rpc(kv_layers) == [1, 1]  # each stage caches only its own layer
        first, last = llm.apply_model(param_numels)
        assert not any(".layers.1." in n for n in first) and not any(".layers.0." in n for n in last)
        assert {"model.decoder.embed_tokens.weight", "model.decoder.embed_positions.weight"} <= set(first)
        assert not any(n.startswith(("lm_head.", "model.decoder.final_layer_norm.")) for n in first)
        assert {"lm_head.weight", "model.decoder.final_layer_norm.weight"} <= set(last)
        assert not any("embed" in n for n in last)
        # OPT ties its LM head to the embedding: the last stage holds its own copy of that one tensor
        stored = checkpoint_numels(opt_dir)
        embedding = next(v for k, v in stored.items() if k.endswith("embed_tokens.weight"))
        assert sum(first.values()) + sum(last.values()) == sum(stored.values()) + embedding
        h.assert_fails_fast_when_rank_1_is_killed(llm)  # the last stage: the first one waits on it
    finally:
        llm.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_llama_tp2_x_pp2_odd_layers_explicit_partition_matches_tp1(llama3_dir):
    """4 processes: stage 0 holds layer 0, stage 1 layers 1 and 2, each split over 2 tp ranks."""
    llm = LLM(
        model=str(llama3_dir),
        tensor_parallel_size=2,
        pipeline_parallel_size=2,
        overrides=["parallel.pp_layer_partition=[1,2]"],
        **h.LLM_KWARGS,
    )
    try:
        h.assert_same_outputs(h.reference(llama3_dir), h.generate(llm))
        assert llm.collective_rpc(kv_layers) == [1, 1, 2, 2]
        shapes = llm.apply_model(
            lambda model: [
                tuple(layer.mlp.gate_up_proj.weight.shape) for layer in model.model.layers if hasattr(layer, "mlp")
            ]
        )
        assert shapes == [[(128, 64)]] * 2 + [[(128, 64)] * 2] * 2  # half of gate and up per tp rank
        names = [set(n) for n in llm.apply_model(param_numels)]
        for rank, held in enumerate(names):
            first_stage = rank < 2
            assert ("model.embed_tokens.weight" in held) == first_stage, rank
            assert ("lm_head.weight" in held) == ("model.norm.weight" in held) == (not first_stage), rank
    finally:
        llm.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "name, config, head",
    [
        ("gpt2", gpt2_config(), "lm_head.weight"),  # tied: the last stage loads wte into its head
        ("gpt-neox-tied-3-layers", gpt_neox_config(num_hidden_layers=3, tie_word_embeddings=True), "embed_out.weight"),
    ],
)
def test_gpt2_and_gpt_neox_pp2_match_pp1(make_checkpoint, name, config, head):
    ckpt = make_checkpoint(name, config)
    llm = LLM(model=str(ckpt), pipeline_parallel_size=2, **h.LLM_KWARGS)
    try:
        h.assert_same_outputs(h.reference(ckpt), h.generate(llm))
        first, last = llm.apply_model(param_numels)
        assert head not in first and head in last
        assert not any("embed_in" in n or "wte" in n for n in last)
    finally:
        llm.shutdown()
