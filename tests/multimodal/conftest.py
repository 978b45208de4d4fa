import pytest

from tests.models.qwen2_vl_checkpoint import build_qwen2_vl
from tests.multimodal.llava_checkpoint import build_llava


@pytest.fixture(scope="session")
def llava_dir(tmp_path_factory, tokenizer_dir):
    return build_llava(tmp_path_factory.mktemp("llava"), tokenizer_dir)


@pytest.fixture(scope="session")
def qwen2_vl_dir(tmp_path_factory, tokenizer_dir):
    return build_qwen2_vl(tmp_path_factory.mktemp("qwen2_vl"), tokenizer_dir)
