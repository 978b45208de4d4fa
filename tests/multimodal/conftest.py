import pytest

from tests.multimodal.llava_checkpoint import build_llava


@pytest.fixture(scope="session")
def llava_dir(tmp_path_factory, tokenizer_dir):
    return build_llava(tmp_path_factory.mktemp("llava"), tokenizer_dir)
