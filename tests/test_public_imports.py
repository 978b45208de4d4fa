"""vLLM's import paths for the user-facing classes work, and give the classes the
engine returns (not look-alikes)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_top_level_names():
    from minivllm import PoolingParams
    from minivllm.pooling.params import PoolingParams as Engine

    assert PoolingParams is Engine and PoolingParams(normalize=False).normalize is False


def test_vllms_other_top_level_names():
    """``from vllm import TextPrompt, TokensPrompt, EmbeddingRequestOutput, ...`` in vLLM scripts."""
    import minivllm
    from minivllm import EmbeddingRequestOutput, PoolingRequestOutput, TextPrompt, TokensPrompt, inputs, outputs

    assert TextPrompt is inputs.TextPrompt and TokensPrompt is inputs.TokensPrompt
    assert PoolingRequestOutput is outputs.PoolingRequestOutput
    assert EmbeddingRequestOutput is outputs.EmbeddingRequestOutput
    assert sorted(minivllm.__all__) == sorted(minivllm._LAZY)


def test_minivllm_outputs_gives_the_front_end_classes():
    import minivllm
    from minivllm.outputs import CompletionOutput, EmbeddingRequestOutput, Logprob, PoolingRequestOutput, RequestOutput
    from minivllm.pooling import EmbeddingRequestOutput as PoolingPackageEmbedding

    assert RequestOutput is minivllm.RequestOutput and CompletionOutput is minivllm.CompletionOutput
    assert Logprob(-0.5, rank=1).logprob == -0.5
    assert PoolingRequestOutput is minivllm.PoolingRequestOutput
    assert EmbeddingRequestOutput is minivllm.EmbeddingRequestOutput is PoolingPackageEmbedding
    with pytest.raises(ImportError):
        from minivllm.outputs import NoSuchOutput  # noqa: F401


def test_importing_minivllm_outputs_does_not_import_the_engine():
    code = "import sys, minivllm.outputs; print('minivllm.engine' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
