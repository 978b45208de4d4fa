"""The engine's options composed pairwise (tests/composition/cells.py): every cell runs the
whole workload (tests/composition/workload.py) and must give its reference engine's outputs
(tests/composition/oracle.py); every refused pair fails when the config is built, naming both."""

from __future__ import annotations

import pytest

from minivllm import LLM
from minivllm.sample.metadata import may_run_ahead
from tests.composition.cells import (
    CHUNK_BUDGET,
    REFUSED,
    Cell,
    allowed_pairs,
    engine_kwargs,
    matrix_cells,
    missing_pairs,
    plain_cell,
)
from tests.composition.oracle import assert_same_as_reference
from tests.composition.workload import RequestSpec, request_specs, with_stops
from tests.engine.test_multi_step import spy_on_steps
from tests.executor import tp_helpers as h
from tests.lora.adapters import make_adapter

CELLS = matrix_cells()


def _cell_param(cell: Cell):
    marks = [pytest.mark.slow] if cell["parallel"] != "tp1" else []  # spawns worker processes
    return pytest.param(cell, id=cell.id, marks=marks)


@pytest.fixture(scope="module", autouse=True)
def no_leftover_children():
    before = h.child_pids()
    yield
    assert h.wait_until(lambda: not (h.child_pids() - before), timeout=10), h.child_pids() - before


@pytest.fixture(scope="module")
def adapter(llama_dir, tmp_path_factory) -> str:
    return str(make_adapter(llama_dir, tmp_path_factory.mktemp("composition") / "adapter", rank=4, alpha=8, seed=30))


def generate(llm: LLM, specs: list[RequestSpec], adapter: str | None) -> list:
    loras = [spec.lora(adapter) for spec in specs]
    return llm.generate([s.prompt for s in specs], [s.params() for s in specs], use_tqdm=False, lora_request=loras)


@pytest.fixture(scope="module")
def specs(llama_dir, adapter) -> list[RequestSpec]:
    """The workload, its stop strings taken from a plain LoRA engine's outputs without them."""
    llm = LLM(str(llama_dir), **engine_kwargs(plain_cell(lora=True)))
    try:
        probe = generate(llm, request_specs(), adapter)
        tokenizer = llm.get_tokenizer()
        assert all(len(tokenizer.encode(s.prompt)) > CHUNK_BUDGET for s in request_specs())  # every prompt chunks
    finally:
        llm.shutdown()
    return with_stops(request_specs(), [out.outputs[0].text for out in probe])


@pytest.fixture(scope="module")
def references(llama_dir, adapter, specs):
    """``references[key]``: the plain engine's outputs for a cell's output-changing options."""
    cache: dict[tuple, list] = {}

    def get(cell: Cell, **device: str) -> list:
        key = (cell.reference_key(), tuple(device.items()))
        if key not in cache:
            plain = plain_cell(**{name: cell[name] for name in ("kv_cache_dtype", "lora")})
            llm = LLM(str(llama_dir), **engine_kwargs(plain), **device)
            try:
                cache[key] = generate(llm, specs, adapter if plain["lora"] else None)
            finally:
                llm.shutdown()
        return cache[key]

    return get


@pytest.mark.parametrize("cell", [_cell_param(c) for c in CELLS])
def test_cell_gives_the_reference_outputs(cell, llama_dir, adapter, specs, references):
    check_cell(cell, llama_dir, adapter, specs, references)


@pytest.mark.gpu
@pytest.mark.parametrize("cell", [c for c in CELLS if c["parallel"] == "tp1"], ids=lambda c: c.id)
def test_cell_on_cuda_gives_the_cuda_reference(cell, llama_dir, adapter, specs, references):
    """The same cells under CUDA's defaults (CUDA graphs, the Triton backend), one GPU."""
    check_cell(cell, llama_dir, adapter, specs, references, device="cuda")


def check_cell(cell: Cell, llama_dir, adapter, specs, references, **device: str) -> None:
    """With prefix caching the workload runs twice: the second time every prompt is cached."""
    reference = references(cell, **device)
    llm = LLM(str(llama_dir), **engine_kwargs(cell), **device)
    seen = spy_on_steps(llm.llm_engine)
    try:
        rounds = 2 if cell["prefix_caching"] else 1
        runs = [generate(llm, specs, adapter if cell["lora"] else None) for _ in range(rounds)]
        engine = llm.llm_engine
        stats, scheduler = engine.get_stats(), engine.core.scheduler
        # Multi-step batches need every running request to run ahead (no grammar, no history-reading sampling):
        # those requests again, alone.
        ahead = [i for i, spec in enumerate(specs) if may_run_ahead(spec.params())] if cell["multi_step"] else []
        alone = generate(llm, [specs[i] for i in ahead], adapter if cell["lora"] else None) if ahead else []
        assert scheduler.kv.num_free_blocks == engine.num_kv_blocks  # nothing leaked
    finally:
        llm.shutdown()
    for outputs in runs:
        assert_same_as_reference(cell, specs, outputs, reference)
    assert_same_as_reference(cell, [specs[i] for i in ahead], alone, [reference[i] for i in ahead])
    assert (max(seen) > 1) == cell["multi_step"]
    assert llm.cfg.async_scheduling == cell["async_scheduling"]
    assert (stats.num_preemptions > 0) == cell["small_kv_cache"]
    if cell["prefix_caching"]:
        assert stats.prefix_cache_hits > 0
    if cell["speculative"]:
        assert stats.spec_decoding.num_accepted_tokens > 0


def test_the_cells_cover_every_allowed_pair_and_no_refused_one():
    assert len(allowed_pairs()) > 60 and not missing_pairs(CELLS)
    assert not any(r.hits(dict(cell.levels)) for cell in CELLS for r in REFUSED)


@pytest.mark.parametrize("refusal", REFUSED, ids=[f"{r.first[0]}-{r.second[0]}" for r in REFUSED])
def test_refused_pair_fails_when_the_config_is_built(refusal, llama_dir):
    """Before any worker starts: a refused pp=2 config spawns no process."""
    kwargs = engine_kwargs(plain_cell(**dict([refusal.first, refusal.second])))
    before = h.child_pids()
    with pytest.raises(ValueError, match=refusal.match):
        LLM(str(llama_dir), **kwargs)
    assert h.child_pids() == before


def test_an_adapter_on_an_engine_without_lora_is_refused(llama_dir, adapter, specs):
    """The request-level refusal: add_request names the key; the engine serves on."""
    llm = LLM(str(llama_dir), **engine_kwargs(plain_cell()))
    try:
        with pytest.raises(ValueError, match=r"lora_request: needs lora.enable_lora=true"):
            generate(llm, specs, adapter)
        assert len(generate(llm, specs[:1], None)[0].outputs[0].token_ids) == specs[0].params().max_tokens
    finally:
        llm.shutdown()
