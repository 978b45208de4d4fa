"""``LLM``: offline batched generation with vLLM's constructor keywords."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from minivllm.config.store import compose
from minivllm.config.vllm_config import VllmConfig
from minivllm.engine.llm_engine import LLMEngine
from minivllm.engine.outputs import RequestOutput
from minivllm.engine.processor import PromptType
from minivllm.sampling_params import RequestOutputKind, SamplingParams
from minivllm.spec_decode.config import speculative_node

# vLLM keyword -> key in the config tree
KWARG_KEYS = {
    "tokenizer": "model.tokenizer",
    "dtype": "model.dtype",
    "max_model_len": "model.max_model_len",
    "seed": "model.seed",
    "hf_overrides": "model.hf_overrides",
    "max_logprobs": "model.max_logprobs",
    "quantization": "model.quantization",
    "tensor_parallel_size": "parallel.tp",
    "pipeline_parallel_size": "parallel.pp",
    "distributed_executor_backend": "parallel.backend",
    "enable_expert_parallel": "parallel.enable_expert_parallel",
    "gpu_memory_utilization": "cache.gpu_memory_utilization",
    "block_size": "cache.block_size",
    "kv_cache_dtype": "cache.cache_dtype",
    "enable_prefix_caching": "cache.enable_prefix_caching",
    "num_gpu_blocks_override": "cache.num_gpu_blocks_override",
    "cpu_memory_gb": "cache.cpu_memory_gb",
    "max_num_seqs": "scheduler.max_num_seqs",
    "max_num_batched_tokens": "scheduler.max_num_batched_tokens",
    "enable_chunked_prefill": "scheduler.enable_chunked_prefill",
    "scheduling_policy": "scheduler.policy",
    "load_format": "load.format",
    "cuda_graph_sizes": "compilation.cudagraph_capture_sizes",
    "attention_backend": "attention.name",
    "device": "device.type",
    "speculative_config": "speculative",
}


def _is_preset(name: str) -> bool:
    conf_dir = Path(__file__).resolve().parents[1] / "conf" / "model"
    return "/" not in name and (conf_dir / f"{name}.yaml").is_file()


def config_from_kwargs(model: str | None = None, overrides: Sequence[str] = (), **kwargs: Any) -> DictConfig:
    """The config tree for ``LLM(model, **kwargs)``: a preset name or a path, vLLM's keywords
    mapped onto their keys, then any Hydra ``overrides``."""
    group_choice = [f"model={model}"] if model and _is_preset(model) else []
    cfg = compose([*group_choice, *overrides])
    if model and not group_choice:
        OmegaConf.update(cfg, "model", {"path": model, "hf_config": None, "tokenizer": None}, merge=True)
    enforce_eager = kwargs.pop("enforce_eager", None)
    if enforce_eager is not None:
        OmegaConf.update(cfg, "compilation.cudagraph", not enforce_eager)
    unknown = sorted(set(kwargs) - set(KWARG_KEYS))
    if unknown:
        raise ValueError(f"LLM(): unknown keyword(s) {', '.join(unknown)}; known: {', '.join(sorted(KWARG_KEYS))}")
    for name, value in kwargs.items():
        if name == "speculative_config" and value is not None:
            OmegaConf.update(cfg, "speculative", speculative_node(value), merge=True)
        elif value is not None:
            OmegaConf.update(cfg, KWARG_KEYS[name], value, merge=False)
    return cfg


class LLM:
    """Offline generation::

        llm = LLM(model="path/to/hf_dir", dtype="float32", block_size=16)
        outs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))
    """

    def __init__(self, model: str | None = None, *, overrides: Sequence[str] = (), **kwargs: Any) -> None:
        self._init(VllmConfig.from_dictconfig(config_from_kwargs(model, overrides, **kwargs)))

    @classmethod
    def from_config(cls, cfg: VllmConfig | DictConfig) -> "LLM":
        llm = cls.__new__(cls)
        llm._init(cfg if isinstance(cfg, VllmConfig) else VllmConfig.from_dictconfig(cfg))
        return llm

    def _init(self, cfg: VllmConfig) -> None:
        self.cfg = cfg
        self.llm_engine = LLMEngine(cfg)

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order.

        All requests are validated before the first is queued, so a bad one
        raises ValueError and leaves the engine as it was.
        """
        prompts = _as_list_of_prompts(prompts)
        params = _params_per_prompt(sampling_params, len(prompts))
        engine = self.llm_engine
        for p, sp in zip(prompts, params):  # validate everything before queuing anything
            _, ids = engine.processor.tokenize(p)
            engine.processor.max_output_tokens(len(ids), sp)
        req_ids = []
        try:
            for i, (p, sp) in enumerate(zip(prompts, params)):
                req_ids.append(engine.add_request(None, p, _final_only(sp), priority[i] if priority else 0))
            return self._run(req_ids, use_tqdm)
        except BaseException:
            engine.abort_request([r for r in req_ids])
            raise

    def _run(self, req_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(req_ids), desc="Processed prompts", unit="req", disable=not use_tqdm or None)
        generated = 0
        with bar:
            while self.llm_engine.has_unfinished_requests():
                for out in self.llm_engine.step():
                    if out.finished:
                        finished[out.request_id] = out
                        generated += sum(len(c.token_ids) for c in out.outputs)
                        bar.update(1)
                        bar.set_postfix_str(f"output {generated / max(bar.format_dict['elapsed'], 1e-9):.1f} tok/s")
        return [finished[r] for r in req_ids]

    def shutdown(self) -> None:
        self.llm_engine.shutdown()

    def __del__(self) -> None:
        engine = getattr(self, "llm_engine", None)
        if engine is not None:
            engine.shutdown()


def _as_list_of_prompts(prompts: Any) -> list[PromptType]:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)]
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts: is empty; give at least one prompt")
    return prompts


def _final_only(params: SamplingParams) -> SamplingParams:
    """generate() returns finished outputs only, so it asks for nothing else (as vLLM's LLM does)."""
    if params.output_kind == RequestOutputKind.FINAL_ONLY:
        return params
    params = params.clone()
    params.output_kind = RequestOutputKind.FINAL_ONLY
    return params


def _params_per_prompt(params: Any, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n:
        raise ValueError(f"sampling_params: {len(params)} given for {n} prompts; give one, or one per prompt")
    return params
