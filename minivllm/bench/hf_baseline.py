"""The transformers baseline: the same requests through ``model.generate``.

Requests run in static batches of ``bench.hf_batch_size`` (left padding, every
row generates its batch's longest ``max_tokens``; only each request's own
``max_tokens`` count as useful output), on the same device, dtype and weights
as minivllm. For ``load.format=dummy`` the weights are first drawn by
transformers and saved as a checkpoint that both sides then load.
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from tqdm.auto import tqdm
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    PreTrainedTokenizerFast,
    StoppingCriteria,
    StoppingCriteriaList,
)

from minivllm.bench.workloads import BenchRequest
from minivllm.config.vllm_config import VllmConfig

logger = logging.getLogger(__name__)
_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def shared_checkpoint(cfg: VllmConfig, out_dir: Path) -> VllmConfig:
    """A config whose weights transformers can load too: ``cfg`` itself when it names
    real weights, else random weights saved by transformers into ``out_dir``."""
    if cfg.load.format != "dummy" and cfg.checkpoint_dir is not None:
        return cfg
    torch.manual_seed(cfg.model.seed)
    model = AutoModelForCausalLM.from_config(cfg.hf_config, dtype=torch.float32)
    model.save_pretrained(out_dir)
    del model
    _save_tokenizer(cfg, out_dir)
    tree = cfg.to_dictconfig()
    OmegaConf.update(tree, "model", {"path": str(out_dir), "hf_config": None, "hf_overrides": {}}, merge=True)
    OmegaConf.update(tree, "model.tokenizer", None)
    OmegaConf.update(tree, "model.dtype", _DTYPE_NAMES[cfg.dtype])
    OmegaConf.update(tree, "load.format", "auto")
    return VllmConfig.from_dictconfig(tree)


def _save_tokenizer(cfg: VllmConfig, out_dir: Path) -> None:
    """The model's own tokenizer when one is found locally, else a placeholder with one
    word per token id (the benchmark's prompts are token ids; text only shows in outputs)."""
    from minivllm.tokenizer import get_tokenizer

    try:
        get_tokenizer(cfg).save_pretrained(out_dir)
        return
    except (ValueError, OSError):
        logger.warning("No local tokenizer for %r; the benchmark uses a placeholder vocabulary.", cfg.tokenizer_path)
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"<t{i}>": i for i in range(cfg.hf_config.vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<t0>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<t0>").save_pretrained(out_dir)


def load_hf_model(cfg: VllmConfig, device: torch.device) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(str(cfg.checkpoint_dir), dtype=cfg.dtype, local_files_only=True)
    return model.to(device).eval()


def _pad_id(model: torch.nn.Module) -> int:
    pad = getattr(model.config, "pad_token_id", None)
    return int(pad) if pad is not None else 0


@torch.inference_mode()
def generate_batch(
    model: torch.nn.Module, prompts: list[list[int]], max_new_tokens: int, temperature: float, stopping_criteria=None
) -> torch.Tensor:
    """Left-padded ``generate`` of exactly ``max_new_tokens`` per row (EOS ignored): (B, max_new_tokens)."""
    device = next(model.parameters()).device
    pad = _pad_id(model)
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p)
        mask[row, width - len(p) :] = 1
    # Unset (None) fields would be filled from the model's generation_config (e.g. top_k=50):
    # spell out plain sampling. min_new_tokens keeps EOS from being drawn, so no row stops early.
    gen = GenerationConfig(
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else 1.0,
        top_k=0,
        top_p=1.0,
        pad_token_id=pad,
    )
    stop = StoppingCriteriaList(stopping_criteria or [])
    out = model.generate(
        input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=gen, stopping_criteria=stop
    )
    return out[:, width:]


def run_hf(
    model: torch.nn.Module, requests: list[BenchRequest], batch_size: int, temperature: float, progress: bool
) -> dict[str, Any]:
    """Time the workload through ``generate``; returns throughput counted in useful tokens."""
    batches = [requests[i : i + batch_size] for i in range(0, len(requests), batch_size)]
    generated = 0
    bar = tqdm(total=len(requests), desc="transformers", unit="req", disable=not progress or None)
    start, start_cpu = time.perf_counter(), time.process_time()
    with bar:
        for batch in batches:
            out = generate_batch(
                model, [r.prompt_token_ids for r in batch], max(r.max_tokens for r in batch), temperature
            )
            if out.shape[1] != max(r.max_tokens for r in batch):
                raise RuntimeError(
                    f"transformers generated {out.shape[1]} tokens, expected {max(r.max_tokens for r in batch)}"
                )
            generated += out.shape[0] * out.shape[1]
            bar.update(len(batch))
    seconds, cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
    input_tokens = sum(len(r.prompt_token_ids) for r in requests)
    output_tokens = sum(r.max_tokens for r in requests)
    return {
        "name": "transformers",
        "batch_size": batch_size,
        "total_time_s": seconds,
        "cpu_time_s": cpu_s,
        "requests_per_s": len(requests) / seconds,
        "input_tokens_per_s": input_tokens / seconds,
        "output_tokens_per_s": output_tokens / seconds,
        "output_tokens": output_tokens,
        "generated_tokens_incl_padding": generated,
    }


class _StepClock(StoppingCriteria):
    """Never stops generation; records when each new token is ready."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        if input_ids.device.type == "cuda":
            torch.cuda.synchronize(input_ids.device)
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def hf_single_request(model: torch.nn.Module, request: BenchRequest, temperature: float) -> dict[str, float]:
    """Decode speed of one request alone, from the median time between consecutive tokens
    (the prefill and one-off stalls stay out of it)."""
    generate_batch(model, [request.prompt_token_ids], 2, temperature)  # warm-up
    clock = _StepClock()
    generate_batch(model, [request.prompt_token_ids], request.max_tokens, temperature, stopping_criteria=[clock])
    step_s = statistics.median(b - a for a, b in zip(clock.times, clock.times[1:]))
    return {"decode_tokens_per_s": 1.0 / step_s, "decode_step_ms": 1e3 * step_s}
