"""Pooling: embeddings from the engine (``model.runner=pooling``).

The model runner hands each finished prompt's hidden states to ``Pooler``
instead of sampling; the front end turns the pooled vector into an embedding
(``dimensions``, ``normalize``) per request.
"""

from minivllm.outputs import EmbeddingOutput, EmbeddingRequestOutput, PoolingOutput, PoolingRequestOutput
from minivllm.pooling.params import PoolingParams

__all__ = ["EmbeddingOutput", "EmbeddingRequestOutput", "PoolingOutput", "PoolingParams", "PoolingRequestOutput"]
