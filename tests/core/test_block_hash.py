import subprocess
import sys
from pathlib import Path

import pytest

import minivllm
from minivllm.core.block_hash import (
    extend_block_hashes,
    hash_block_tokens,
    model_identity,
    request_extra_keys,
    root_hash,
)
from tests.core.scheduler_helpers import base_config

ROOT = root_hash({"path": "m"})


def test_same_tokens_different_parent_give_different_hashes():
    first_a = hash_block_tokens(ROOT, [1, 2, 3, 4])
    first_b = hash_block_tokens(ROOT, [9, 9, 9, 9])
    assert hash_block_tokens(first_a, [5, 6, 7, 8]) != hash_block_tokens(first_b, [5, 6, 7, 8])
    assert hash_block_tokens(first_a, [5, 6, 7, 8]) == hash_block_tokens(first_a, [5, 6, 7, 8])


def test_salt_and_model_separate_identical_tokens():
    tokens = [1, 2, 3, 4]
    plain = hash_block_tokens(ROOT, tokens, request_extra_keys(None))
    salted = hash_block_tokens(ROOT, tokens, request_extra_keys("tenant-a"))
    other_salt = hash_block_tokens(ROOT, tokens, request_extra_keys("tenant-b"))
    other_model = hash_block_tokens(root_hash({"path": "other"}), tokens, request_extra_keys(None))
    assert len({plain, salted, other_salt, other_model}) == 4


def test_model_identity_covers_weights_and_dtype():
    cfg = base_config()
    base = root_hash(model_identity(cfg))
    assert root_hash(model_identity(cfg)) == base
    cfg.model.seed = 7  # dummy weights change with the seed
    assert root_hash(model_identity(cfg)) != base


def test_only_full_blocks_are_hashed_and_growth_is_incremental():
    tokens = list(range(11))
    hashes = extend_block_hashes([], tokens, 4, ROOT)
    assert len(hashes) == 2  # 11 tokens: two full blocks of 4, three tokens left over
    assert hashes[1] == hash_block_tokens(hashes[0], tokens[4:8])
    grown = extend_block_hashes([], tokens[:5], 4, ROOT)
    extend_block_hashes(grown, tokens, 4, ROOT)
    assert grown == hashes


def test_hash_is_the_same_in_another_process():
    """sha256, not Python's per-process seeded hash: a fresh interpreter with a different
    PYTHONHASHSEED computes the same value."""
    code = (
        "from minivllm.core.block_hash import hash_block_tokens, root_hash;"
        "print(hash_block_tokens(root_hash({'path': 'm'}), [1, 2, 3], (('cache_salt', 's'),)).hex())"
    )
    env = {"PYTHONHASHSEED": "123", "PYTHONPATH": str(Path(minivllm.__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == hash_block_tokens(ROOT, [1, 2, 3], (("cache_salt", "s"),)).hex()


def test_hashing_from_an_offset_equals_hashing_the_whole_sequence():
    tokens = list(range(30))
    whole = extend_block_hashes([], tokens, 4, ROOT, request_extra_keys("s"))
    grown = extend_block_hashes([], tokens[:9], 4, ROOT, request_extra_keys("s"))  # two blocks
    extend_block_hashes(grown, tokens[8:], 4, ROOT, request_extra_keys("s"), offset=8)
    assert grown == whole
    with pytest.raises(ValueError, match="offset=12"):
        extend_block_hashes(list(whole[:2]), tokens[12:], 4, ROOT, offset=12)  # block 2 would be skipped


def test_token_count_and_extra_keys_cannot_be_confused():
    """The bytes hashed are self-delimiting: a token more, or extra keys instead of
    tokens, never give the same hash as a neighbouring input."""
    salt = request_extra_keys("s")
    assert (
        len(
            {
                hash_block_tokens(ROOT, [1, 2]),
                hash_block_tokens(ROOT, [1, 2, 0]),
                hash_block_tokens(ROOT, [1, 2], salt),
                hash_block_tokens(ROOT, [1], salt),
                hash_block_tokens(ROOT, []),
            }
        )
        == 5
    )
