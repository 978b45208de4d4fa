"""``load.format=tensorizer``: weights from a file written by the ``tensorizer`` package.

A tensorizer file stores tensors back to back with their metadata in front,
so they stream from disk (or a socket) straight into memory. The serialized
checkpoint is a model directory like any other (``config.json``, tokenizer
files) with the weights in ``model.tensors`` under their Hugging Face names;
the model's own ``load_weights`` then shards them, so one file serves every
tensor-parallel size. Write one with::

    python tools/serialize_tensorizer.py path/to/hf_checkpoint path/to/out_dir
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from tqdm.auto import tqdm

from minivllm.config.vllm_config import VllmConfig
from minivllm.layers.weight_utils import as_tensor
from minivllm.model_loader.loader import DefaultModelLoader
from minivllm.model_loader.weight_files import copy_model_files, find_weight_files, iterate_weights

TENSORIZER_FILE = "model.tensors"


def serialize_checkpoint(checkpoint: Path, out: Path, load_format: str = "auto") -> Path:
    """Write ``checkpoint``'s weights to ``out/model.tensors`` and copy its other files; return the file."""
    from tensorizer import TensorSerializer

    kind, files = find_weight_files(checkpoint, load_format)
    copy_model_files(checkpoint, out)
    serializer = TensorSerializer(str(out / TENSORIZER_FILE))
    try:
        for path in tqdm(files, desc="Serializing", unit="file", disable=len(files) < 2 or None):
            serializer.write_state_dict({name: as_tensor(t) for name, t in iterate_weights(kind, [path])})
    finally:
        serializer.close()
    return out / TENSORIZER_FILE


class TensorizerModelLoader(DefaultModelLoader):
    """The default build (meta device, then materialise) with weights streamed from ``model.tensors``."""

    def _weights(self, cfg: VllmConfig) -> Iterator[tuple[str, Any]]:
        from tensorizer import TensorDeserializer

        path = cfg.checkpoint_dir / TENSORIZER_FILE
        if not path.is_file():
            raise ValueError(
                f"load.format=tensorizer: no {TENSORIZER_FILE} in {cfg.checkpoint_dir}; write one with "
                f"python tools/serialize_tensorizer.py <checkpoint> <out_dir>"
            )
        deserializer = TensorDeserializer(str(path), device="cpu", lazy_load=True)
        try:
            for name in deserializer.keys():
                yield name, deserializer[name]
        finally:
            deserializer.close()
