"""Vision-language architectures and the test module that holds their parity test against
transformers (they take images, so they are not in tests/models/parity_cases.py)."""

MULTIMODAL_PARITY = {
    "LlavaForConditionalGeneration": "tests/multimodal/test_llava_generate.py",
    "Qwen2VLForConditionalGeneration": "tests/models/test_qwen2_vl_generate.py",
}
