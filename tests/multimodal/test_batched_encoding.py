"""The images of one step go through the vision encoder in one call where the model allows:
LLaVA stacks same-size pixel tensors, Qwen2-VL concatenates the patches of images of any
size (its ViT keeps them apart by cu_seqlens). Each image's embeddings equal those of
encoding it alone, and the generated tokens still equal transformers'."""

from __future__ import annotations

import torch

from minivllm import LLM, SamplingParams
from minivllm.attention.torch_backend import TorchAttentionBackend
from minivllm.models.qwen2_vl import Qwen2VLForConditionalGeneration
from minivllm.multimodal.feature import MultiModalFeature, encoder_batches
from minivllm.worker.mm_runner import MultiModalRunner
from tests.models.qwen2_vl_checkpoint import (
    PATCH_FEATURES,
    VISION,
    HFQwen2VL,
    build_qwen2_vl,
    tiny_hf_model,
    tiny_qwen2_vl_config,
)
from tests.models.qwen2_vl_checkpoint import random_image as qwen_image
from tests.multimodal.llava_checkpoint import HFLlava, random_image

PROMPT = "USER: <image>\nWhat is in the picture? ASSISTANT:"
TWO = f"user: compare {VISION}with {VISION}please\nassistant:"
GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def _feature(name: str, length: int, **data: torch.Tensor) -> MultiModalFeature:
    return MultiModalFeature(name, "image", 0, length, data)


def _count_calls(monkeypatch, model) -> list[int]:
    """One entry per ``embed_multimodal`` call of ``model``: the rows it returned."""
    calls: list[int] = []
    encode = model.embed_multimodal

    def counted(**data):
        out = encode(**data)
        calls.append(out.shape[0])
        return out

    monkeypatch.setattr(model, "embed_multimodal", counted)
    return calls


def test_images_join_a_call_when_their_tensors_agree_beyond_dim_0():
    small, large = torch.zeros(1, 3, 16, 16), torch.zeros(1, 3, 32, 32)
    llava = [_feature("a", 16, pixel_values=small), _feature("b", 64, pixel_values=large)]
    llava.append(_feature("c", 16, pixel_values=small))
    assert encoder_batches(llava, batched=True) == [[0, 2], [1]]
    assert encoder_batches(llava, batched=False) == [[0], [1], [2]]
    grids = [(1, 4, 4), (1, 6, 4)]
    qwen = [
        _feature(str(g), g[1] * g[2] // 4, pixel_values=torch.zeros(g[1] * g[2], 8), image_grid_thw=torch.tensor([g]))
        for g in grids
    ]
    assert encoder_batches(qwen, batched=True) == [[0, 1]]


@torch.no_grad()
def test_qwen2_vl_two_sizes_in_one_call_equal_each_alone(monkeypatch):
    config = tiny_qwen2_vl_config()
    hf = tiny_hf_model(config)
    ours = Qwen2VLForConditionalGeneration(config, TorchAttentionBackend())
    ours.load_weights(hf.state_dict().items())
    runner = MultiModalRunner(ours.eval(), torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    features = []
    grids = [("small", (1, 4, 4)), ("tall", (1, 6, 4)), ("wide", (1, 4, 8)), ("small2", (1, 4, 4))]
    for name, (t, h, w) in grids:  # the two small ones share the ViT's attention calls
        pixels = torch.randn(t * h * w, PATCH_FEATURES, generator=gen)
        features.append(_feature(name, t * h * w // 4, pixel_values=pixels, image_grid_thw=torch.tensor([[t, h, w]])))
    alone = [ours.embed_multimodal(**f.data) for f in features]
    calls = _count_calls(monkeypatch, ours)
    together = runner.run_encoder(features)
    assert calls == [sum(f.length for f in features)]  # one call for the four images
    for f, one, joined in zip(features, alone, together):
        assert joined.shape == (f.length, config.text_config.hidden_size)
        torch.testing.assert_close(joined, one, atol=1e-5, rtol=1e-5)
        reference = hf.model.visual(f.data["pixel_values"], grid_thw=f.data["image_grid_thw"]).pooler_output
        torch.testing.assert_close(joined, reference, atol=1e-5, rtol=1e-5)


def test_llava_step_with_two_images_encodes_once(llava_dir, monkeypatch):
    """Two requests with different images are scheduled in one step: one encoder call for both,
    embeddings equal to encoding each alone, tokens equal to transformers'."""
    llm = LLM(str(llava_dir), max_model_len=128, block_size=16, num_gpu_blocks_override=32)
    runner = llm.llm_engine.core.executor.worker.model_runner
    images = [random_image(20), random_image(21)]
    features = [
        _feature(str(i), p.length, **p.data)
        for i, p in enumerate(llm.llm_engine.processor.mm.process_image(im) for im in images)
    ]
    with torch.no_grad():
        alone = [runner.model.embed_multimodal(**f.data) for f in features]
        together = runner.mm.run_encoder(features)
    for one, joined in zip(alone, together):
        torch.testing.assert_close(joined, one, atol=1e-5, rtol=1e-5)
    calls = _count_calls(monkeypatch, runner.model)
    outs = llm.generate([{"prompt": PROMPT, "multi_modal_data": {"image": im}} for im in images], GREEDY)
    assert calls == [2 * features[0].length]
    assert runner.mm.num_encoded == 2
    hf = HFLlava(llava_dir)
    for out, image in zip(outs, images):
        assert list(out.outputs[0].token_ids) == hf.greedy(PROMPT, [image], GREEDY.max_tokens)[1]


def test_qwen2_vl_prompt_with_two_sizes_encodes_once(tmp_path_factory, tokenizer_dir, monkeypatch):
    """Two images of different sizes in one prompt: one encoder call, tokens equal to transformers'."""
    checkpoint = build_qwen2_vl(tmp_path_factory.mktemp("qwen2_vl_batched"), tokenizer_dir)
    llm = LLM(
        str(checkpoint), max_model_len=128, block_size=8, num_gpu_blocks_override=32, limit_mm_per_prompt={"image": 2}
    )
    model = llm.llm_engine.core.executor.worker.model_runner.model
    calls = _count_calls(monkeypatch, model)
    images = [qwen_image(1, 56, 84), qwen_image(2, 112, 84)]  # 2 x 3 and 4 x 3 merged tokens
    out = llm.generate({"prompt": TWO, "multi_modal_data": {"image": images}}, GREEDY)[0]
    assert calls == [6 + 12]
    assert (out.prompt_token_ids, list(out.outputs[0].token_ids)) == HFQwen2VL(checkpoint).greedy(
        TWO, images, GREEDY.max_tokens
    )
