"""Benchmark workloads: a list of requests (prompt token ids + output length, and images).

Every request generates exactly ``max_tokens`` tokens (EOS is ignored), so the
work is fixed by the workload and identical for minivllm and the baseline; a jsonl
line may set its own ``temperature`` and ``ignore_eos``.

``nanovllm_instance`` is the exact request list of nano-vllm's ``bench.py``;
``write_jsonl`` saves requests as lines ``bench.workload=jsonl`` replays, so a peer
engine and minivllm run the same instance (``tools/nanovllm_peer.py``)::

    python -m minivllm.bench.workloads nanovllm PATH.jsonl

The ``images`` workload gives each request some random images ahead of random text.
Random text must never hold the image model's placeholder tokens (a prompt with
placeholders and no image is refused). The engine expands each placeholder to the
image's feature count, so a request's prompt grows by the image's tokens; the
throughput counts the expanded prompts.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Collection

import numpy as np
from PIL import Image

from minivllm.config.task import BenchConfig
from minivllm.config.vllm_config import VllmConfig

PLACEHOLDER_KEYS = ("image_token_id", "image_token_index", "video_token_id")


@dataclass(frozen=True, slots=True)
class BenchRequest:
    prompt_token_ids: list[int]
    max_tokens: int
    images: tuple[Any, ...] = ()
    """PIL images whose placeholder tokens the prompt holds (bench.workload=images)."""
    temperature: float | None = None
    """This request's temperature (a jsonl line's); None: bench.temperature."""
    ignore_eos: bool = True
    """Generate all max_tokens whatever the model samples (a jsonl line may say false)."""

    @property
    def prompt(self) -> dict[str, Any]:
        """The engine's prompt: token ids, with the images when there are some."""
        if not self.images:
            return {"prompt_token_ids": self.prompt_token_ids}
        return {"prompt_token_ids": self.prompt_token_ids, "multi_modal_data": {"image": list(self.images)}}

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + self.max_tokens


def build_workload(
    cfg: BenchConfig,
    vocab_size: int,
    max_model_len: int,
    encode: Callable[[str], list[int]] | None = None,
    exclude: Collection[int] = (),
) -> list[BenchRequest]:
    """The requests of ``cfg.workload`` (not images: ``image_requests``); ``encode``
    tokenizes text prompts (jsonl); random ids never take a value in ``exclude`` (an image
    model's placeholder tokens, which a prompt without images may not hold)."""
    rng = np.random.default_rng(cfg.seed)
    if cfg.workload == "random":
        requests = random_requests(cfg, vocab_size, rng, exclude)
    elif cfg.workload == "shared_prefix":
        requests = shared_prefix_requests(cfg, vocab_size, rng, exclude)
    elif cfg.workload == "jsonl":
        requests = jsonl_requests(cfg, encode, rng)
    else:
        raise ValueError(f"bench.workload={cfg.workload}: not a text workload")
    check_fits(requests, max_model_len)
    return requests


def _output_lens(cfg: BenchConfig, n: int, rng: np.random.Generator) -> list[int]:
    return rng.integers(cfg.min_output_len, cfg.max_output_len + 1, size=n).tolist()


def random_ids(n: int, vocab_size: int, rng: np.random.Generator, exclude: Collection[int] = ()) -> list[int]:
    """``n`` ids uniform over the vocabulary less ``exclude`` (the same draws as before when it is empty)."""
    if not exclude:
        return rng.integers(0, vocab_size, size=n).tolist()
    allowed = np.setdiff1d(np.arange(vocab_size), np.fromiter(exclude, dtype=np.int64))
    return allowed[rng.integers(0, len(allowed), size=n)].tolist()


def rehearsal_requests(cfg: VllmConfig, requests: list[BenchRequest]) -> list[BenchRequest] | None:
    """On the CPU with ``bench.warmup``, what the warm-up runs untimed before the timed run: the timed
    requests with their token ids renamed (each distinct id to a random one, the same everywhere).
    They have the timed run's prompt and output lengths and shared prefixes, so the engine schedules
    the same steps (oneDNN builds a kernel for every new row count at its first call, 0.5-1 ms each)
    while no prompt hits the timed prompts' prefix cache. None elsewhere (GPU warm-ups keep their
    few representative steps) and with images (the encoder is warmed apart)."""
    if not cfg.bench.warmup or cfg.device_type != "cpu" or any(r.images for r in requests):
        return None
    exclude = placeholder_token_ids(cfg)
    distinct = sorted({t for r in requests for t in r.prompt_token_ids})
    rng = np.random.default_rng(cfg.bench.seed + 4)
    rename = dict(zip(distinct, random_ids(len(distinct), cfg.hf_text_config.vocab_size, rng, exclude)))
    return [replace(r, prompt_token_ids=[rename[t] for t in r.prompt_token_ids]) for r in requests]


def random_requests(
    cfg: BenchConfig, vocab_size: int, rng: np.random.Generator, exclude: Collection[int] = ()
) -> list[BenchRequest]:
    input_lens = rng.integers(cfg.min_input_len, cfg.max_input_len + 1, size=cfg.num_prompts).tolist()
    outputs = _output_lens(cfg, cfg.num_prompts, rng)
    return [BenchRequest(random_ids(n, vocab_size, rng, exclude), m) for n, m in zip(input_lens, outputs)]


def shared_prefix_requests(
    cfg: BenchConfig, vocab_size: int, rng: np.random.Generator, exclude: Collection[int] = ()
) -> list[BenchRequest]:
    prefixes = [random_ids(cfg.prefix_len, vocab_size, rng, exclude) for _ in range(cfg.num_prefixes)]
    suffix_lens = rng.integers(cfg.min_input_len, cfg.max_input_len + 1, size=cfg.num_prompts).tolist()
    outputs = _output_lens(cfg, cfg.num_prompts, rng)
    requests = []
    for i, (n, m) in enumerate(zip(suffix_lens, outputs)):
        prefix = prefixes[i % cfg.num_prefixes] if _shares_prefix(i, cfg.prefix_ratio) else []
        suffix = random_ids(n + cfg.prefix_len - len(prefix), vocab_size, rng, exclude)
        requests.append(BenchRequest(prefix + suffix, m))
    return requests


def _shares_prefix(i: int, ratio: float) -> bool:
    """Whether request i starts with a common prefix: ``ratio`` of them, spread evenly (all at 1.0)."""
    return int((i + 1) * ratio) > int(i * ratio)


def jsonl_requests(
    cfg: BenchConfig, encode: Callable[[str], list[int]] | None, rng: np.random.Generator
) -> list[BenchRequest]:
    path = Path(cfg.prompts_file or "").expanduser()
    if not path.is_file():
        raise ValueError(f"bench.prompts_file={cfg.prompts_file!r}: no such file")
    lines = [line for line in path.read_text().splitlines() if line.strip()][: cfg.num_prompts]
    if not lines:
        raise ValueError(f"bench.prompts_file={cfg.prompts_file!r}: holds no prompts")
    outputs = _output_lens(cfg, len(lines), rng)
    requests = []
    for number, (line, default_len) in enumerate(zip(lines, outputs), start=1):
        record = _parse_line(line, path, number)
        if "prompt_token_ids" in record:
            ids = [int(t) for t in record["prompt_token_ids"]]
        elif encode is None:
            raise ValueError(f"{path}:{number}: a text prompt needs a tokenizer")
        else:
            ids = encode(str(record["prompt"]))
        temperature = record.get("temperature")
        requests.append(
            BenchRequest(
                ids,
                int(record.get("max_tokens", default_len)),
                temperature=None if temperature is None else float(temperature),
                ignore_eos=bool(record.get("ignore_eos", True)),
            )
        )
    return requests


def _parse_line(line: str, path: Path, number: int) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"bench.prompts_file: {path}:{number} is not JSON ({err.msg})") from None
    if not isinstance(record, dict) or not ({"prompt", "prompt_token_ids"} & record.keys()):
        raise ValueError(f"bench.prompts_file: {path}:{number} needs a 'prompt' or 'prompt_token_ids' key")
    return record


NANOVLLM_SEED = 0
NANOVLLM_NUM_SEQS = 256
NANOVLLM_MAX_INPUT_LEN = 1024
NANOVLLM_MAX_OUTPUT_LEN = 1024
NANOVLLM_TEMPERATURE = 0.6


def nanovllm_instance() -> list[BenchRequest]:
    """nano-vllm's bench.py requests, draw for draw: Python's ``random`` seeded with 0, then
    256 prompts (each a length ``randint(100, 1024)`` drawn first, then that many token ids
    ``randint(0, 10000)``), then 256 ``max_tokens`` of ``randint(100, 1024)``; temperature
    0.6, EOS ignored. A private generator: the global ``random`` state is left alone."""
    rng = random.Random(NANOVLLM_SEED)
    prompts = [
        [rng.randint(0, 10000) for _ in range(rng.randint(100, NANOVLLM_MAX_INPUT_LEN))]
        for _ in range(NANOVLLM_NUM_SEQS)
    ]
    max_tokens = [rng.randint(100, NANOVLLM_MAX_OUTPUT_LEN) for _ in range(NANOVLLM_NUM_SEQS)]
    return [BenchRequest(p, m, temperature=NANOVLLM_TEMPERATURE) for p, m in zip(prompts, max_tokens)]


def write_jsonl(requests: list[BenchRequest], path: Path) -> None:
    """One line per request: prompt_token_ids, max_tokens, temperature (when set), ignore_eos."""
    lines = []
    for r in requests:
        record: dict[str, Any] = {"prompt_token_ids": r.prompt_token_ids, "max_tokens": r.max_tokens}
        if r.temperature is not None:
            record["temperature"] = r.temperature
        record["ignore_eos"] = r.ignore_eos
        lines.append(json.dumps(record, separators=(",", ":")))
    Path(path).write_text("\n".join(lines) + "\n")


def check_fits(requests: list[BenchRequest], max_model_len: int) -> None:
    for i, r in enumerate(requests):
        if not r.prompt_token_ids or r.max_tokens < 1:
            raise ValueError(f"bench workload: request {i} has an empty prompt or max_tokens < 1")
        if r.num_tokens > max_model_len:
            raise ValueError(
                f"bench workload: request {i} needs {len(r.prompt_token_ids)} prompt + {r.max_tokens} output tokens, "
                f"more than max_model_len={max_model_len}; lower bench.max_input_len / bench.max_output_len"
            )


# ---- images -----------------------------------------------------------------------------


def placeholder_token_ids(cfg: VllmConfig) -> frozenset[int]:
    """The ids a prompt may hold only with images: the model's image (and video) tokens."""
    if not cfg.is_multimodal:
        return frozenset()
    hf = cfg.hf_config
    return frozenset(int(getattr(hf, key)) for key in PLACEHOLDER_KEYS if getattr(hf, key, None) is not None)


def image_token_id(cfg: VllmConfig) -> int:
    """The placeholder of one image in a prompt (expanded by the engine)."""
    from minivllm.models.registry import ModelRegistry

    if not cfg.is_multimodal:
        raise ValueError(
            f"bench.workload=images: model {cfg.model.path!r} ({cfg.architecture}) takes no images; "
            "use a vision-language checkpoint (python -m tools.tiny_vlm llava DIR builds a tiny one)"
        )
    return int(ModelRegistry.resolve(cfg.architecture).image_token_id(cfg.hf_config))


def random_image(size: int, rng: np.random.Generator) -> Image.Image:
    return Image.fromarray(rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8))


def image_requests(cfg: VllmConfig) -> list[BenchRequest]:
    """``bench.num_prompts`` requests: ``images_per_request`` placeholders, then random text of
    [min_input_len, max_input_len] tokens; distinct random images (no encoder-cache sharing)."""
    bench: BenchConfig = cfg.bench
    placeholder = image_token_id(cfg)
    limit = dict(cfg.model.limit_mm_per_prompt).get("image", 1)
    if bench.images_per_request > limit:
        raise ValueError(
            f"bench.images_per_request={bench.images_per_request}: more than model.limit_mm_per_prompt's "
            f"image limit {limit}; raise it (+model.limit_mm_per_prompt.image=N)"
        )
    rng = np.random.default_rng(bench.seed)
    exclude = placeholder_token_ids(cfg) | {placeholder}
    vocab_size = cfg.hf_text_config.vocab_size
    text_lens = rng.integers(bench.min_input_len, bench.max_input_len + 1, size=bench.num_prompts).tolist()
    outputs = rng.integers(bench.min_output_len, bench.max_output_len + 1, size=bench.num_prompts).tolist()
    requests = []
    for n, m in zip(text_lens, outputs):
        images = tuple(random_image(bench.image_size, rng) for _ in range(bench.images_per_request))
        ids = [placeholder] * bench.images_per_request + random_ids(n, vocab_size, rng, exclude)
        requests.append(BenchRequest(ids, m, images))
    check_fits(requests, cfg.max_model_len)  # before expansion: the engine refuses what still does not fit
    return requests


INSTANCES = {"nanovllm": nanovllm_instance}

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in INSTANCES:
        sys.exit(f"usage: python -m minivllm.bench.workloads {{{','.join(INSTANCES)}}} PATH.jsonl")
    instance = INSTANCES[sys.argv[1]]()
    write_jsonl(instance, Path(sys.argv[2]))
    print(
        f"{sys.argv[2]}: {len(instance)} requests, {sum(len(r.prompt_token_ids) for r in instance)} prompt tokens, "
        f"{sum(r.max_tokens for r in instance)} output tokens"
    )
