"""Content hashes of full KV-cache blocks, the keys of the prefix cache.

A block's hash covers everything its keys and values depend on::

    hash(block i) = sha256(hash(block i-1), token ids of block i, extra keys)
    hash(block -1) = the model's root hash (checkpoint, architecture, dtypes, ...)

Chaining through the parent makes a hash name the whole prefix up to and
including its block, so two blocks with the same tokens after different
prefixes never match. The extra keys carry what else changes the KV of the
same tokens: a request's ``cache_salt`` and its LoRA adapter id, so requests that must not share, never do,
and, per block, the identifier (content hash) of each image whose placeholder tokens the
block holds: two prompts with the same text and different images have the same token ids
but never share KV.

The bytes hashed are the parent's 32 bytes, the number of tokens, the tokens
as little-endian int64 and, only when there are extra keys, their pickle: every
part before the last has a known length, so two different inputs never give
the same bytes. sha256 over them is deterministic across processes and runs
(Python's own ``hash`` is seeded per process), so hashes could be exchanged
between engines of the same version (this layout is not the one before it).
A block fills every ``block_size`` decode steps of every running request, so
this runs tens of times per step at a few hundred requests: packing
fixed-width integers costs about half of what pickling a tuple did.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import struct
from typing import TYPE_CHECKING, Any, Callable, Sequence

from minivllm.request import BlockHash

if TYPE_CHECKING:
    from minivllm.multimodal.feature import MultiModalFeature

ExtraKeys = tuple[Any, ...]
BlockKeys = Callable[[int], ExtraKeys]
"""Block index -> extra keys of that block alone (the images its tokens hold)."""

_PICKLE_PROTOCOL = 5


def hash_block_tokens(parent: BlockHash, token_ids: Sequence[int], extra_keys: ExtraKeys = ()) -> BlockHash:
    """The hash of one full block given its parent's hash (32 bytes)."""
    n = len(token_ids)
    payload = parent + struct.pack(f"<q{n}q", n, *token_ids)
    if extra_keys:
        payload += pickle.dumps(extra_keys, protocol=_PICKLE_PROTOCOL)
    return BlockHash(hashlib.sha256(payload).digest())


def root_hash(model_identity: Any) -> BlockHash:
    """The parent of every request's first block: one value per model identity."""
    payload = json.dumps(model_identity, sort_keys=True, default=str).encode()
    return BlockHash(hashlib.sha256(b"minivllm-prefix-cache\0" + payload).digest())


def model_identity(cfg: Any) -> dict[str, Any]:
    """What about the model decides the KV of a token sequence (for ``root_hash``)."""
    return {
        "path": str(cfg.checkpoint_dir or cfg.model.path),
        "architecture": cfg.architecture,
        "hf_overrides": dict(cfg.model.hf_overrides),
        "dtype": str(cfg.dtype),
        "kv_cache_dtype": str(cfg.kv_cache_dtype),
        "load_format": cfg.load.format,
        "seed": cfg.model.seed if cfg.load.format == "dummy" else None,
    }


def request_extra_keys(cache_salt: str | None, lora_int_id: int | None = None) -> ExtraKeys:
    """Per-request keys mixed into every block hash of that request."""
    keys = () if cache_salt is None else (("cache_salt", cache_salt),)
    return keys if lora_int_id is None else (*keys, ("lora", lora_int_id))


def mm_block_keys(features: list[MultiModalFeature], block_size: int) -> BlockKeys:
    """Per block: ``("mm", identifier)`` of each image with placeholders in the block."""

    def keys(block: int) -> ExtraKeys:
        start = block * block_size
        return tuple(("mm", f.identifier) for f in features if f.overlaps(start, start + block_size))

    return keys


def extend_block_hashes(
    hashes: list[BlockHash],
    token_ids: Sequence[int],
    block_size: int,
    root: BlockHash,
    extra_keys: ExtraKeys = (),
    offset: int = 0,
    block_keys: BlockKeys | None = None,
) -> list[BlockHash]:
    """Append to ``hashes`` the hashes of the full blocks of the sequence it lacks.

    ``token_ids`` holds the sequence's tokens from position ``offset`` on (a
    multiple of ``block_size``, at most ``len(hashes) * block_size``), so a caller
    passes only the tail that holds the new blocks, not a copy of the whole
    sequence. ``hashes`` must already hold the hashes of the first ``len(hashes)``
    blocks of these same tokens, so calling this as a sequence grows costs one
    hash per newly filled block. ``block_keys`` adds each block's own keys (its images).
    """
    if offset % block_size or offset > len(hashes) * block_size:
        raise ValueError(f"offset={offset}: must be a multiple of {block_size} at most {len(hashes) * block_size}")
    num_full = (offset + len(token_ids)) // block_size
    for i in range(len(hashes), num_full):
        parent = hashes[i - 1] if i > 0 else root
        start = i * block_size - offset
        keys = extra_keys + block_keys(i) if block_keys is not None else extra_keys
        hashes.append(hash_block_tokens(parent, token_ids[start : start + block_size], keys))
    return hashes
