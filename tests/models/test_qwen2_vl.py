"""Qwen2-VL's parts against transformers on one tiny random checkpoint: the vision tower,
the language model with M-RoPE positions and merged embeddings, and the M-RoPE positions
themselves against transformers' ``get_rope_index``."""

from __future__ import annotations

import pytest
import torch

from minivllm.attention.backend import AttentionMetadata
from minivllm.attention.torch_backend import TorchAttentionBackend
from minivllm.layers.attention import attention_layers
from minivllm.models.qwen2_vl import Qwen2VLForConditionalGeneration
from tests.models.qwen2_vl_checkpoint import (
    IMAGE_TOKEN,
    PATCH_FEATURES,
    image_prompt,
    tiny_hf_model,
    tiny_qwen2_vl_config,
)

GRIDS = [(1, 4, 4), (1, 6, 4)]  # (t, h, w) patches: two images of different sizes
BLOCK = 8


@pytest.fixture(scope="module")
def models():
    config = tiny_qwen2_vl_config()
    hf = tiny_hf_model(config)
    ours = Qwen2VLForConditionalGeneration(config, TorchAttentionBackend())
    ours.load_weights(hf.state_dict().items())  # transformers' in-memory names: model.visual.*, model.language_model.*
    return hf, ours.eval()


@torch.no_grad()
def test_vision_tower_matches_transformers(models):
    hf, ours = models
    patches = sum(t * h * w for t, h, w in GRIDS)
    pixels = torch.randn(patches, PATCH_FEATURES, generator=torch.Generator().manual_seed(0))
    expected = hf.model.visual(pixels, grid_thw=torch.tensor(GRIDS)).pooler_output  # (patches / 4, hidden)
    torch.testing.assert_close(ours.visual(pixels, GRIDS), expected, atol=1e-5, rtol=1e-5)
    first = GRIDS[0][1] * GRIDS[0][2]
    one = ours.embed_multimodal(pixel_values=pixels[first:], image_grid_thw=torch.tensor([GRIDS[1]]))
    torch.testing.assert_close(one, expected[first // 4 :], atol=1e-5, rtol=1e-5)  # no attention across images
    with pytest.raises(ValueError, match="pixel_values has 40 patches; image_grid_thw"):
        ours.embed_multimodal(pixel_values=pixels[: first + 24], image_grid_thw=torch.tensor([GRIDS[0]]))


def _hf_rope_index(hf, ids: list[int], grids) -> tuple[torch.Tensor, int]:
    input_ids = torch.tensor([ids])
    types = (input_ids == IMAGE_TOKEN).int()
    positions, deltas = hf.model.get_rope_index(input_ids, types, image_grid_thw=torch.tensor(grids))
    return positions[:, 0], int(deltas[0, 0])


@pytest.mark.parametrize("grids", [GRIDS[:1], GRIDS, GRIDS[::-1]], ids=["one", "two", "two_swapped"])
def test_mrope_positions_match_get_rope_index(models, grids):
    hf, ours = models
    ids, features = image_prompt([3, 5, 2][: len(grids) + 1], grids)
    positions, delta = ours.get_mrope_input_positions(ids, features[::-1])  # any order: sorted by offset
    expected, expected_delta = _hf_rope_index(hf, ids, grids)
    assert positions.shape == (3, len(ids)) and positions.dtype == torch.int64
    assert torch.equal(positions, expected)
    assert delta == expected_delta


def test_mrope_positions_refuse_a_grid_that_does_not_fit(models):
    _, ours = models
    ids, features = image_prompt([3, 2], GRIDS[:1])
    features[0].data["image_grid_thw"] = torch.tensor([GRIDS[1]])
    with pytest.raises(ValueError, match="img0: 4 placeholder tokens, but its grid .* has 6"):
        ours.get_mrope_input_positions(ids, features)


def _prefill_meta(n: int) -> AttentionMetadata:
    blocks = -(-n // BLOCK)
    return AttentionMetadata(
        slot_mapping=torch.arange(n),
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([n], dtype=torch.int32),
        block_tables=torch.arange(blocks, dtype=torch.int32)[None],
        max_query_len=n,
        max_seq_len=n,
        query_lens_cpu=[n],
        seq_lens_cpu=[n],
    )


@torch.no_grad()
def test_language_model_with_mrope_and_image_embeddings_matches_transformers(models):
    hf, ours = models
    ids, features = image_prompt([4, 3, 2], GRIDS, seed=3)
    hidden_size = hf.config.text_config.hidden_size
    is_image = torch.tensor(ids) == IMAGE_TOKEN
    embeds = ours.embed_input_ids(torch.tensor(ids))
    embeds[is_image] = torch.randn(int(is_image.sum()), hidden_size, generator=torch.Generator().manual_seed(1))
    positions, _ = ours.get_mrope_input_positions(ids, features)
    expected = hf.model.language_model(inputs_embeds=embeds[None], position_ids=positions[:, None]).last_hidden_state[0]
    for layer in attention_layers(ours):
        layer.kv_cache = torch.zeros(2, -(-len(ids) // BLOCK), BLOCK, layer.num_kv_heads, layer.head_dim)
    meta = _prefill_meta(len(ids))
    meta.backend_data = ours.model.layers[0].self_attn.attn.backend.prepare(meta, BLOCK)
    hidden = ours(torch.tensor(ids), positions, meta, inputs_embeds=embeds)
    torch.testing.assert_close(hidden, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours.compute_logits(hidden), hf.lm_head(expected), atol=1e-4, rtol=1e-4)
    for layer in attention_layers(ours):
        layer.kv_cache = None
