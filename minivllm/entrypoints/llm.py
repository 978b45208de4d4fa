"""``LLM``: offline batched generation with vLLM's constructor keywords.

Its methods take their arguments in vLLM's per-prompt form: one prompt or many,
one set of parameters for all prompts or one per prompt (``per_prompt``).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, TypeVar

from omegaconf import DictConfig
from torch import nn
from tqdm.auto import tqdm

from minivllm.config.llm_kwargs import config_from_kwargs, name_the_keyword
from minivllm.config.load import generation_defaults
from minivllm.config.task import served_model_names
from minivllm.config.vllm_config import VllmConfig
from minivllm.data_parallel.engine import DataParallelEngine
from minivllm.engine.llm_engine import LLMEngine
from minivllm.engine.processor import ProcessedRequest
from minivllm.engine.stats import Metric, engine_metrics
from minivllm.entrypoints.beam_search import BeamSearchOutput, run_beam_search
from minivllm.entrypoints.chat_utils import Conversation, is_single_conversation, render_chat
from minivllm.executor.base import apply_to_model
from minivllm.inputs import PromptType
from minivllm.lora_request import LoRARequest
from minivllm.multimodal.media import MediaConnector
from minivllm.outputs import EmbeddingRequestOutput, PoolingRequestOutput, RequestOutput
from minivllm.plugins import load_general_plugins
from minivllm.pooling.params import PoolingParams
from minivllm.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams

T = TypeVar("T")


class LLM:
    """Offline generation::

    llm = LLM(model="path/to/hf_dir", dtype="float32", block_size=16)
    outs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))
    """

    def __init__(self, model: str | None = None, *, overrides: Sequence[str] = (), **kwargs: Any) -> None:
        tree = config_from_kwargs(model, overrides, **kwargs)
        try:
            cfg = _validated(tree)
        except ValueError as err:
            raise ValueError(name_the_keyword(str(err), kwargs)) from err
        self._init(cfg)

    @classmethod
    def from_config(cls, cfg: VllmConfig | DictConfig) -> "LLM":
        llm = cls.__new__(cls)
        llm._init(cfg if isinstance(cfg, VllmConfig) else _validated(cfg))
        return llm

    def _init(self, cfg: VllmConfig) -> None:
        self.cfg = cfg
        self.default_sampling_params = generation_defaults(cfg.model.generation_config, cfg.checkpoint_dir)
        self.llm_engine: LLMEngine | DataParallelEngine
        if cfg.parallel.dp > 1:  # replicas in their own processes, behind one front end
            self.llm_engine = DataParallelEngine(cfg)
        else:
            self.llm_engine = LLMEngine(cfg)

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What generate() uses when given no SamplingParams (the checkpoint's generation config, see
        ``model.generation_config``)."""
        return SamplingParams(**self.default_sampling_params)

    def reset_prefix_cache(self) -> bool:
        """Forget the prefix cache (after a weight update: its KV was computed with the old weights);
        False, with a warning, and nothing changed while requests are running."""
        return self.llm_engine.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        """Give back memory between rollouts (``LLM(enable_sleep_mode=True)``; docs/rl.md).

        Level 1 frees the KV cache and moves the weights to host memory; level 2 frees the
        weights too (load new ones after ``wake_up(tags=["weights"])``). The prefix cache is
        forgotten. Refused while requests are unfinished; generating while asleep is an error.
        """
        self._single_engine("sleep").sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Bring back what ``sleep`` put away: ``tags`` among "weights", "kv_cache"; None: both."""
        self._single_engine("wake_up").wake_up(tags)

    def _single_engine(self, method: str) -> LLMEngine:
        if not isinstance(self.llm_engine, LLMEngine):
            raise ValueError(f"{method}(): not supported with parallel.dp > 1 (data_parallel_size)")
        return self.llm_engine

    def get_metrics(self) -> list[Metric]:
        """vLLM-named counters and gauges (``vllm:prompt_tokens``, ...; the prefix is ``serve.metrics_prefix``)."""
        engine = self.llm_engine
        name = served_model_names(self.cfg.serve.served_model_name, self.cfg.model.path)[0]
        return engine_metrics(
            engine.get_stats(), engine.counters.num_finished_requests, name, self.cfg.serve.metrics_prefix
        )

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order.

        All requests are validated before the first is queued, so a bad one
        raises ValueError and leaves the engine as it was. ``lora_request``: one adapter
        for every prompt or one (or None) per prompt.
        """
        self._needs_runner("generate", "generate")
        prompts = as_list_of_prompts(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params = params_per_prompt(sampling_params, len(prompts))
        loras = loras_per_prompt(lora_request, len(prompts))
        processor = self.llm_engine.processor
        requests = [  # every prompt is checked (and tokenized, once) before any is queued
            processor.process(None, p, final_only(sp), priority=priority[i] if priority else 0, lora_request=lora)
            for i, (p, sp, lora) in enumerate(zip(prompts, params, loras))
        ]
        return self._add_and_run(requests, use_tqdm)

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them, through the chat template
        (the tokenizer's, or ``chat_template``); one output per conversation; ``lora_request`` as in generate."""
        conversations = [messages] if is_single_conversation(messages) else list(messages)
        prompts = [
            render_chat(
                self.get_tokenizer(),
                conversation,
                chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tools=tools,
                chat_template_kwargs=chat_template_kwargs,
                media=MediaConnector.for_config(self.cfg),
            )
            for conversation in conversations
        ]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm, lora_request=lora_request)

    def beam_search(
        self, prompts: PromptType | Sequence[PromptType], params: BeamSearchParams, *, use_tqdm: bool = False
    ) -> list[BeamSearchOutput]:
        """Beam search per prompt (see ``minivllm.entrypoints.beam_search``); each round is one batch of ordinary
        one-token requests, so beams share their prompt's KV blocks through the prefix cache."""
        self._needs_runner("generate", "beam_search")
        return run_beam_search(self.llm_engine, prompts, params, use_tqdm)

    def encode(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        *,
        use_tqdm: bool = True,
        pooling_task: str = "embed",
        truncate_prompt_tokens: int | None = None,
    ) -> list[PoolingRequestOutput]:
        """Pooled vectors of the prompts (``runner="pooling"``); outputs in prompt order."""
        self._needs_runner("pooling", "encode")
        if pooling_task != "embed":
            raise ValueError(f"pooling_task={pooling_task!r}: only 'embed' is supported")
        prompts = as_list_of_prompts(prompts)
        params = pooling_params_per_prompt(pooling_params, len(prompts), truncate_prompt_tokens)
        processor = self.llm_engine.processor
        requests = [processor.process(None, p, pp) for p, pp in zip(prompts, params)]  # all checked first
        return self._add_and_run(requests, use_tqdm)

    def embed(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        *,
        use_tqdm: bool = True,
        truncate_prompt_tokens: int | None = None,
    ) -> list[EmbeddingRequestOutput]:
        """One embedding per prompt (``runner="pooling"``): ``outs[i].outputs.embedding``."""
        self._needs_runner("pooling", "embed")
        outs = self.encode(prompts, pooling_params, use_tqdm=use_tqdm, truncate_prompt_tokens=truncate_prompt_tokens)
        return [EmbeddingRequestOutput.from_base(o) for o in outs]

    def _needs_runner(self, runner: str, method: str) -> None:
        if self.cfg.model.runner != runner:
            raise ValueError(
                f"{method}(): needs runner={runner!r}, but this LLM was built with runner={self.cfg.model.runner!r} "
                f"(LLM(..., runner={runner!r}))"
            )

    def _add_and_run(self, requests: list[ProcessedRequest], use_tqdm: bool) -> list[RequestOutput]:
        """Queue processed requests and run them to the end; an error (or Ctrl-C) aborts the queued ones."""
        req_ids = []
        try:
            for request in requests:
                req_ids.append(self.llm_engine.add_processed(request))
            return self._run(req_ids, use_tqdm)
        except BaseException:
            self.llm_engine.abort_request(req_ids)
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
                        if isinstance(out, RequestOutput):  # pooling outputs generate nothing
                            generated += sum(len(c.token_ids) for c in out.outputs)
                        bar.update(1)
                        bar.set_postfix_str(f"output {generated / max(bar.format_dict['elapsed'], 1e-9):.1f} tok/s")
        return [finished[r] for r in req_ids]

    def collective_rpc(
        self,
        method: str | Callable,
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Run ``method`` on every worker; one result per rank, in rank order.

        ``method`` is a Worker method name, or a function called as
        ``method(worker, *args, **kwargs)`` in each worker's process (lambdas
        and closures work: they travel with cloudpickle). An exception on a
        rank raises RuntimeError naming the rank; the engine keeps serving.
        """
        if timeout is not None:
            raise ValueError(f"collective_rpc: timeout={timeout!r} is not supported; leave it None")
        return self.llm_engine.collective_rpc(method, args, kwargs)

    def apply_model(self, func: Callable[[nn.Module], Any]) -> list[Any]:
        """``func(model)`` on every rank's model (its shard under tensor parallelism); results in rank order."""
        return self.collective_rpc(apply_to_model, args=(func,))

    def shutdown(self) -> None:
        self.llm_engine.shutdown()

    def __del__(self) -> None:
        engine = getattr(self, "llm_engine", None)
        if engine is not None:
            engine.shutdown()


def _validated(tree: DictConfig) -> VllmConfig:
    """The plugins the tree allows are called first: one may register the architecture the config checks."""
    load_general_plugins(tree.get("plugins"))
    return VllmConfig.from_dictconfig(tree)


def as_list_of_prompts(prompts: Any) -> list[PromptType]:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)]
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts: is empty; give at least one prompt")
    return prompts


def per_prompt(value: Any, n: int, name: str, single: type[T], default: Callable[[], T | None]) -> list[T | None]:
    """``value`` broadcast to ``n`` prompts: None (``default()`` for each), one ``single``,
    or a sequence of exactly ``n``."""
    if value is None:
        return [default()] * n
    if isinstance(value, single):
        return [value] * n
    values = list(value)
    if len(values) != n:
        raise ValueError(f"{name}: {len(values)} given for {n} prompts; give one, or one per prompt")
    return values


def params_per_prompt(params: Any, n: int) -> list[SamplingParams]:
    return per_prompt(params, n, "sampling_params", SamplingParams, SamplingParams)


def loras_per_prompt(lora: Any, n: int) -> list[LoRARequest | None]:
    return per_prompt(lora, n, "lora_request", LoRARequest, lambda: None)


def pooling_params_per_prompt(params: Any, n: int, truncate: int | None) -> list[PoolingParams]:
    params = per_prompt(params, n, "pooling_params", PoolingParams, PoolingParams)
    if truncate is not None:
        params = [PoolingParams(p.dimensions, p.normalize, truncate) for p in params]
    return params


def final_only(params: SamplingParams) -> SamplingParams:
    """generate() returns finished outputs only, so it asks for nothing else (as vLLM's LLM does)."""
    if params.output_kind == RequestOutputKind.FINAL_ONLY:
        return params
    params = params.clone()
    params.output_kind = RequestOutputKind.FINAL_ONLY
    return params
