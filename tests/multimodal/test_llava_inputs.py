"""Image inputs: chat messages with image_url parts (data URLs, allowed local files),
the per-prompt limit, and every bad input refused with the field named while the
engine keeps serving."""

from __future__ import annotations

import base64

import pytest

from minivllm import LLM, SamplingParams
from tests.multimodal.llava_checkpoint import HFLlava, data_url, random_image

GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
PROMPT = "USER: <image>\nWhat is it? ASSISTANT:"


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("media")
    random_image(11).save(folder / "pic.png")
    return folder


@pytest.fixture(scope="module")
def llm(llava_dir, media_dir):
    return LLM(
        str(llava_dir),
        max_model_len=256,
        num_gpu_blocks_override=64,
        limit_mm_per_prompt={"image": 2},
        allowed_local_media_path=str(media_dir),
    )


def _chat(image_url: str, text: str = "What is it?") -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": image_url}}, {"type": "text", "text": text}]
    return [{"role": "user", "content": parts}]


def test_chat_with_a_data_url_matches_transformers(llm, llava_dir):
    image = random_image(10)
    out = llm.chat(_chat(data_url(image)), GREEDY)[0]
    hf = HFLlava(llava_dir)
    text = hf.processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}],
        add_generation_prompt=True,
    )
    ids, tokens = hf.greedy(text, [image], 5)
    assert out.prompt_token_ids == ids
    assert list(out.outputs[0].token_ids) == tokens


def test_chat_with_an_allowed_local_file(llm, media_dir):
    from_file = llm.chat(_chat(f"file://{media_dir / 'pic.png'}"), GREEDY)[0]
    direct = llm.generate({"prompt": from_file.prompt, "multi_modal_data": {"image": random_image(11)}}, GREEDY)[0]
    assert from_file.outputs[0].token_ids == direct.outputs[0].token_ids


def test_two_images_in_one_prompt(llm, llava_dir):
    images = [random_image(12), random_image(13)]
    prompt = "USER: <image> and <image>\nCompare. ASSISTANT:"
    out = llm.generate({"prompt": prompt, "multi_modal_data": {"image": images}}, GREEDY)[0]
    ids, tokens = HFLlava(llava_dir).greedy(prompt, images, 5)
    assert out.prompt_token_ids == ids and list(out.outputs[0].token_ids) == tokens


BAD_INPUTS = [
    ({"prompt": "USER: no placeholder here", "multi_modal_data": {"image": random_image(1)}}, "placeholder"),
    ({"prompt": PROMPT, "multi_modal_data": {"image": [random_image(1)] * 3}}, "limit_mm_per_prompt"),
    ({"prompt": PROMPT, "multi_modal_data": {"image": "not an image"}}, "PIL.Image"),
    ({"prompt": PROMPT, "multi_modal_data": {"video": random_image(1)}}, "'video'"),
    ({"prompt": PROMPT}, "no image was given"),
]


@pytest.mark.parametrize("prompt,needle", BAD_INPUTS)
def test_bad_inputs_are_refused_and_the_engine_keeps_serving(llm, prompt, needle):
    with pytest.raises(ValueError, match="multi_modal_data|prompt") as err:
        llm.generate(prompt, GREEDY)
    assert needle in str(err.value)
    ok = llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": random_image(0)}}, GREEDY)[0]
    assert len(ok.outputs[0].token_ids) == 5


@pytest.mark.parametrize(
    "url,needle",
    [
        ("data:image/png;base64," + base64.b64encode(b"not a png").decode(), "could not decode"),
        ("data:image/png;base64,@@@", "not valid base64"),
        ("file:///etc/hostname", "outside model.allowed_local_media_path"),
        ("ftp://example.com/x.png", "scheme"),
    ],
)
def test_bad_image_urls(llm, url, needle):
    with pytest.raises(ValueError, match="image_url") as err:
        llm.chat(_chat(url), GREEDY)
    assert needle in str(err.value)


def test_local_files_refused_without_an_allowed_folder(media_dir):
    from minivllm.multimodal.media import MediaConnector

    with pytest.raises(ValueError, match="allowed_local_media_path"):
        MediaConnector().load_image(f"file://{media_dir / 'pic.png'}")


def test_unreachable_http_url_is_a_clear_error():
    from minivllm.multimodal.fetch import FetchRules, MediaFetcher
    from minivllm.multimodal.media import MediaConnector

    loopback = MediaFetcher(FetchRules(allowed_domains=("127.0.0.1",), deadline_s=2.0))
    with pytest.raises(ValueError, match="could not fetch"):
        MediaConnector(fetcher=loopback).load_image("http://127.0.0.1:9/none.png")


def test_text_only_model_refuses_images(llama_dir):
    llm = LLM(str(llama_dir), num_gpu_blocks_override=32, max_model_len=128)
    with pytest.raises(ValueError, match="multi_modal_data: LlamaForCausalLM takes no images"):
        llm.generate({"prompt": "hi", "multi_modal_data": {"image": random_image(0)}}, GREEDY)
    assert len(llm.generate("hi", GREEDY)[0].outputs[0].token_ids) == 5


@pytest.mark.parametrize(
    "kwargs,key",
    [
        (dict(enable_lora=True), "lora.enable_lora"),
        (dict(runner="pooling"), "model.runner=pooling"),
        (dict(speculative_config={"method": "ngram", "num_speculative_tokens": 2}), "speculative.method"),
    ],
)
def test_unsupported_combinations_are_refused(llava_dir, kwargs, key):
    with pytest.raises(ValueError, match=key):
        LLM(str(llava_dir), num_gpu_blocks_override=16, max_model_len=128, **kwargs)
