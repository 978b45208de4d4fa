"""The image models on CUDA under CUDA's defaults: CUDA graphs (where the model allows them),
async scheduling, torch.compile of the small ops, chunked prefill. The checks of the CPU
tests (tests/multimodal/test_llava_generate.py, tests/models/test_qwen2_vl_generate.py), with
transformers on the GPU as the oracle:

- float32 (TF32 off on both sides): tokens equal transformers' ``generate``, prompts whole
  and cut into small chunks through the images; Qwen2-VL (M-RoPE) with torch.compile on and off;
- bf16, where equality with an fp32 reference is not expected: LLaVA's CUDA graphs equal its
  eager run exactly (same batch size, no padding), and each bf16 run agrees with transformers'
  fp32 tokens up to the first step where fp32 itself is unsure (top-2 logit margin under
  ``MIN_MARGIN``; on the CPU, bf16 parted from fp32 only at margins of 0.04 or less).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from minivllm import LLM
from minivllm.config.vllm_config import VllmConfig
from tests.models.qwen2_vl_checkpoint import ONE_IMAGE, HFQwen2VL, parity_prompts
from tests.models.qwen2_vl_checkpoint import random_image as qwen_image
from tests.multimodal.llava_checkpoint import NUM_IMAGE_TOKENS, PROMPT, HFLlava, random_image
from tests.multimodal.vlm_greedy import agreed_steps, engine_greedy

pytestmark = pytest.mark.gpu

MAX_TOKENS = 8
MIN_MARGIN = 0.2
LLAVA_CHUNKS = dict(  # 5-token steps: the 16 placeholders of each image over several steps
    max_num_batched_tokens=5,
    overrides=[
        f"scheduler.max_num_encoder_input_tokens={NUM_IMAGE_TOKENS}",
        f"scheduler.encoder_cache_size={NUM_IMAGE_TOKENS}",
    ],
)
QWEN_CHUNKS = dict(  # 8-token steps: placeholders and their M-RoPE positions arrive in pieces
    max_num_batched_tokens=8,
    overrides=["scheduler.max_num_encoder_input_tokens=64", "scheduler.encoder_cache_size=64"],
)


@pytest.fixture(scope="module", autouse=True)
def no_tf32():
    """float32 means float32 on both sides: no TF32 in cuBLAS or cuDNN (transformers' patch
    embeddings are convolutions, which cuDNN runs in TF32 unless told not to)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture(scope="module")
def hf_llava(llava_dir):
    return HFLlava(llava_dir, device="cuda")


@pytest.fixture(scope="module")
def hf_qwen(qwen2_vl_dir):
    return HFQwen2VL(qwen2_vl_dir, device="cuda")


@dataclass
class Run:
    outputs: list[tuple[list[int], list[int]]]
    """(prompt ids, greedy tokens) per prompt."""
    cfg: VllmConfig
    graphs: bool
    """CUDA graphs were captured."""


def _generate(checkpoint, prompts, **kwargs) -> Run:
    """Greedy outputs of a CUDA engine with its defaults but ``kwargs`` (and a KV cache of 256
    blocks, not 90% of the GPU: stage b runs tests in parallel processes on one GPU)."""
    llm = LLM(str(checkpoint), device="cuda", max_model_len=256, seed=0, num_gpu_blocks_override=256, **kwargs)
    try:
        assert llm.cfg.async_scheduling and llm.cfg.scheduler.enable_chunked_prefill
        graphs = llm.llm_engine.core.executor.worker.model_runner.cuda_graphs is not None
        return Run(engine_greedy(llm, prompts, MAX_TOKENS), llm.cfg, graphs)
    finally:
        llm.shutdown()


@pytest.mark.parametrize("chunks", [{}, LLAVA_CHUNKS], ids=["whole", "chunked"])
def test_llava_float32_equals_transformers(llava_dir, hf_llava, chunks):
    images = [random_image(i) for i in range(4)]
    prompts = [(PROMPT, [im]) for im in images]
    expected = [hf_llava.greedy(PROMPT, [im], MAX_TOKENS) for im in images]
    assert len({tuple(tokens) for _, tokens in expected}) > 1, "the images should steer the model apart"
    run = _generate(llava_dir, prompts, dtype="float32", **chunks)
    assert run.graphs and run.cfg.torch_compile
    assert run.outputs == expected


def test_llava_bf16_graphs_equal_eager_and_agree_with_fp32(llava_dir, hf_llava):
    """Four requests decode at batch 4, a captured size: the replayed graph runs the eager
    step's kernels on the same shapes, so the tokens are the same to the last bit."""
    images = [random_image(10 + i) for i in range(4)]
    prompts = [(PROMPT, [im]) for im in images]
    graphs = _generate(llava_dir, prompts)
    eager = _generate(llava_dir, prompts, enforce_eager=True)
    assert graphs.cfg.dtype == torch.bfloat16 and graphs.graphs and not eager.graphs
    assert graphs.outputs == eager.outputs
    agreed = [
        agreed_steps(tokens, hf_llava.run(PROMPT, [im], MAX_TOKENS)[1], MIN_MARGIN)
        for (_, tokens), im in zip(graphs.outputs, images)
    ]
    assert sum(agreed) > 0, "no step where fp32 was sure: the check compared nothing"


@pytest.mark.parametrize(
    "torch_compile, chunks",
    [(True, {}), (True, QWEN_CHUNKS), (False, QWEN_CHUNKS)],
    ids=["compiled-whole", "compiled-chunked", "eager-ops-chunked"],
)
def test_qwen2_vl_float32_equals_transformers(qwen2_vl_dir, hf_qwen, torch_compile, chunks):
    """One image of three sizes, two images of different sizes in one prompt; M-RoPE rotary
    under torch.compile (CUDA's default) and without it give transformers' tokens."""
    prompts = parity_prompts()
    expected = [hf_qwen.greedy(p, ims, MAX_TOKENS) for p, ims in prompts]
    assert len({tuple(tokens) for _, tokens in expected}) > 1, "the images should steer the model apart"
    overrides = [*chunks.get("overrides", []), f"compilation.torch_compile={str(torch_compile).lower()}"]
    kwargs = {k: v for k, v in chunks.items() if k != "overrides"}
    run = _generate(
        qwen2_vl_dir, prompts, dtype="float32", limit_mm_per_prompt={"image": 2}, overrides=overrides, **kwargs
    )
    assert run.cfg.torch_compile == torch_compile
    assert not run.graphs  # (3, T) M-RoPE positions: decode steps run eagerly, by design
    assert run.outputs == expected


def test_qwen2_vl_bf16_agrees_with_fp32(qwen2_vl_dir, hf_qwen):
    """The tiny Qwen2-VL is unsure of its first token for most prompts: more images (all three
    heights), so that some prompts have steps to compare."""
    more = [(ONE_IMAGE, [qwen_image(100 + i, 56 + 28 * (i % 3), 84)]) for i in range(9)]
    prompts = parity_prompts() + more
    run = _generate(qwen2_vl_dir, prompts, limit_mm_per_prompt={"image": 2})
    assert run.cfg.dtype == torch.bfloat16 and run.cfg.torch_compile
    references = [hf_qwen.run(p, ims, MAX_TOKENS) for p, ims in prompts]
    assert [ids for ids, _ in run.outputs] == [ids for ids, _ in references]
    agreed = [agreed_steps(tokens, ref, MIN_MARGIN) for (_, tokens), (_, ref) in zip(run.outputs, references)]
    assert sum(agreed) > 0, "no step where fp32 was sure: the check compared nothing"
