"""The engine options of the composition matrix, the pairs that are refused, and the
engine configurations (cells) that cover every other pair at least once.

Each option has a *plain* level (its first) and one or two others. A cell is one
engine: ``allpairspy`` picks the cells so that every pair of levels of two options
appears in some cell, leaving out the pairs in ``REFUSED``; those are checked
separately, as errors when the config is built. Two options change the outputs by
design (the fp8 KV cache, LoRA enabled with an adapter); a cell is compared with the
plain engine that has the same two (``reference_key``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from allpairspy import AllPairs

OPTIONS: dict[str, list[Any]] = {
    "parallel": ["tp1", "tp2", "pp2"],
    "prefix_caching": [False, True],
    "chunked_prefill": [False, True],
    "small_kv_cache": [False, True],
    "kv_cache_dtype": ["auto", "fp8"],
    "async_scheduling": [False, True],
    "speculative": [None, "ngram"],
    "lora": [False, True],
    "multi_step": [False, True],
}
"""Option -> its levels, the plain one first. allpairspy builds rows greedily, and with a filter
it can leave pairs out; in this order it leaves none (``matrix_cells`` adds a cell for any it would)."""

OUTPUT_CHANGING = ("kv_cache_dtype", "lora")
"""Options a cell shares with its reference engine: they change the tokens by design."""

CHUNK_BUDGET = 8
"""Token budget of a step with chunked prefill on: shorter than every prompt of the workload."""
SMALL_CACHE_BLOCKS = 24
"""KV blocks (of 4 tokens) of the small cache: every request fits alone, the workload does not."""
MULTI_STEPS = 4
"""Decode steps a batch runs with multi-step decoding on."""
SPEC_CONFIG = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


@dataclass(frozen=True)
class Refusal:
    """Two option levels that must fail when the config is built, with a message naming both."""

    first: tuple[str, Any]
    second: tuple[str, Any]
    match: str
    """A regex the ValueError's message matches."""
    why: str

    def hits(self, levels: dict[str, Any]) -> bool:
        return all(name in levels and levels[name] == value for name, value in (self.first, self.second))


REFUSED = [
    Refusal(
        ("parallel", "pp2"),
        ("speculative", "ngram"),
        r"speculative.method=ngram: not supported with parallel.pp=2",
        "the stages other than the last would need the accepted drafts too",
    ),
    Refusal(
        ("parallel", "pp2"),
        ("lora", True),
        r"lora.enable_lora=true with parallel.pp=2",
        "adapter slots are not split into pipeline stages",
    ),
    Refusal(
        ("parallel", "pp2"),
        ("async_scheduling", True),
        r"scheduler.async_scheduling=true: not supported with parallel.pp > 1",
        "pipeline stages step synchronously (micro-batches overlap them instead)",
    ),
    Refusal(
        ("parallel", "pp2"),
        ("multi_step", True),
        r"scheduler.num_scheduler_steps=4: not supported with parallel.pp=2",
        "the last stage's tokens reach the first one through the scheduler, once a step",
    ),
    Refusal(
        ("speculative", "ngram"),
        ("multi_step", True),
        r"scheduler.num_scheduler_steps=4: not supported with speculative.method=ngram",
        "drafts are verified between steps",
    ),
    Refusal(
        ("speculative", "ngram"),
        ("async_scheduling", True),
        r"scheduler.async_scheduling=true: not supported with speculative.method=ngram",
        "each step is scheduled after the previous one's accepted tokens",
    ),
]


@dataclass(frozen=True)
class Cell:
    """One engine configuration: a level for every option."""

    levels: tuple[tuple[str, Any], ...]

    def __getitem__(self, name: str) -> Any:
        return dict(self.levels)[name]

    @property
    def id(self) -> str:
        on = [name if value is True else str(value) for name, value in self.levels if value not in (False, None)]
        return "-".join(v for v in on if v not in ("tp1", "auto")) or "plain"

    def reference_key(self) -> tuple[Any, ...]:
        return tuple(self[name] for name in OUTPUT_CHANGING)


def _allowed(partial: list[Any]) -> bool:
    """allpairspy's filter: ``partial`` holds the first levels of a row, in ``OPTIONS`` order."""
    levels = dict(zip(OPTIONS, partial))
    return not any(refusal.hits(levels) for refusal in REFUSED)


def matrix_cells() -> list[Cell]:
    """Cells covering every allowed pair of option levels: allpairspy's rows, then one plain
    cell with the pair set for each allowed pair they miss."""
    cells = [Cell(tuple(zip(OPTIONS, row))) for row in AllPairs(list(OPTIONS.values()), filter_func=_allowed)]
    for first, second in missing_pairs(cells):
        cells.append(plain_cell(**dict([first, second])))
    return cells


def allowed_pairs() -> list[tuple[tuple[str, Any], tuple[str, Any]]]:
    """Every pair of levels of two options that no refusal names."""
    levels = [(name, value) for name, values in OPTIONS.items() for value in values]
    return [
        (a, b)
        for a, b in itertools.combinations(levels, 2)
        if a[0] != b[0] and not any(r.hits(dict([a, b])) for r in REFUSED)
    ]


def missing_pairs(cells: list[Cell]) -> list[tuple[tuple[str, Any], tuple[str, Any]]]:
    return [(a, b) for a, b in allowed_pairs() if not any(c[a[0]] == a[1] and c[b[0]] == b[1] for c in cells)]


def plain_cell(**levels: Any) -> Cell:
    """Every option at its plain level except ``levels``."""
    return Cell(tuple((name, levels.get(name, values[0])) for name, values in OPTIONS.items()))


def engine_kwargs(cell: Cell) -> dict[str, Any]:
    """``LLM(...)`` keywords of a cell (float32: the tokens of two cells differ only where
    an option changes the arithmetic's order, which float32 keeps below any greedy margin)."""
    chunked = cell["chunked_prefill"]
    kwargs: dict[str, Any] = dict(
        dtype="float32",
        block_size=4,
        max_model_len=128,
        max_num_seqs=16,
        async_scheduling=cell["async_scheduling"],
        enable_prefix_caching=cell["prefix_caching"],
        enable_chunked_prefill=chunked,
        max_num_batched_tokens=CHUNK_BUDGET if chunked else 256,
        num_gpu_blocks_override=SMALL_CACHE_BLOCKS if cell["small_kv_cache"] else 512,
        kv_cache_dtype=cell["kv_cache_dtype"],
        tensor_parallel_size=2 if cell["parallel"] == "tp2" else 1,
        pipeline_parallel_size=2 if cell["parallel"] == "pp2" else 1,
        disable_log_stats=True,
    )
    if cell["speculative"]:
        kwargs["speculative_config"] = dict(SPEC_CONFIG)
    if cell["lora"]:
        kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=8)
    if cell["multi_step"]:
        kwargs["num_scheduler_steps"] = MULTI_STEPS
    return kwargs
