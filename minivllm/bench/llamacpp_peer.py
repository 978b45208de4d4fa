"""The llama.cpp peer of ``task=bench bench.baseline=llamacpp``: the same requests through
llama.cpp's batched API, from ``llama-cpp-python`` in its own virtual environment.

Like ``vllm_peer.py``, llama.cpp is never a dependency of minivllm: this file runs as a script
under ``bench.peer_python`` (the venv's python; docs/bench.md). The script has two commands,
each importing only the standard library and what that venv holds:

- ``convert CHECKPOINT OUT.gguf`` (``gguf``, ``numpy``): the Hugging Face Llama checkpoint as an
  f32 GGUF laid out as llama.cpp's ``convert_hf_to_gguf.py`` lays it out (its tensor names, the
  q/k rows permuted so each head's rotary pairs are interleaved, ``llama.*`` metadata). The
  safetensors are read with numpy (no torch in that venv). The vocabulary is the checkpoint's
  token strings, padded to ``vocab_size`` with ``[PADn]``, as a ``llama`` (SentencePiece-type)
  vocabulary: the peer is given token ids and never tokenizes or detokenizes, so only the count
  and the special ids matter. llama.cpp's own converter needs torch and transformers and refuses
  a byte-level BPE tokenizer whose pre-tokenizer it does not know (a random checkpoint's).
- ``run REQUESTS.json RESULT.json`` (``llama_cpp``): loads the GGUF and runs the requests.

The run uses llama.cpp's low-level batched API, as its ``batched``/``parallel`` examples do:
one context with ``n_seq_max`` = the number of requests and a KV stream per sequence
(``kv_unified=false``, so a sequence attends over its own cells only), ``n_ctx`` =
``max_model_len`` cells per sequence, K/V cached in f32 like minivllm's fp32 cache. The first
``llama_decode`` gets every prompt in one ``llama_batch`` (``n_batch`` = all prompt tokens, so it
is one call; llama.cpp splits it into ``n_ubatch``-token micro-batches, at most 512), logits only
for each prompt's last token; then each step decodes one token of every unfinished sequence in
one batch (sequence ids by ``max_tokens``, longest first: ``Runner.generate`` says why). Greedy (llama.cpp's greedy sampler, the first of equal maxima), EOS ignored, each
request generates exactly its ``max_tokens``. Threads: ``n_threads`` = ``n_threads_batch`` =
minivllm's worker threads. Flash attention is off: llama.cpp's default (``auto``) turns its CPU
flash-attention kernel on, which rounds differently enough to flip greedy near-ties (on the table
workload 23 of 32 requests agreed with minivllm, every first difference a near-tie of 3e-5 to 1.3e-3
nats; 32 of 32 with it off) and was not faster there (benchmarks/RESULTS.md).

The driver (``run_peer``, in minivllm's process) converts the checkpoint once (cached under
``minivllm.utils.cache_dir("gguf")``, keyed by the checkpoint's path and its files' mtimes; next
to the random weights, in the run's scratch folder, for ``load.format=dummy``), writes the
requests as JSON and reads back throughput, CPU time, start-up, single-request decode speed
and every request's tokens, which the report compares with minivllm's.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minivllm.bench.workloads import BenchRequest
    from minivllm.config.vllm_config import VllmConfig

GGUF_NAME = "model-f32.gguf"


# ---- the driver (minivllm's process) ---------------------------------------------------------


def gguf_path(checkpoint: str, scratch: Path) -> Path:
    """Where the f32 GGUF of ``checkpoint`` lives: in ``scratch`` when the checkpoint does (random
    weights saved for this run), else under minivllm's cache, keyed by the checkpoint's resolved
    path and the names, sizes and mtimes of its config and weight files."""
    ckpt = Path(checkpoint).resolve()
    if ckpt.is_relative_to(Path(scratch).resolve()):
        return Path(scratch) / GGUF_NAME
    from minivllm.utils import cache_dir

    files = sorted(p for p in ckpt.iterdir() if p.suffix in (".safetensors", ".json"))
    stamp = [str(ckpt)] + [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files]
    key = hashlib.sha256("\n".join(stamp).encode()).hexdigest()[:16]
    return cache_dir("gguf", f"{ckpt.name}-{key}") / GGUF_NAME


def peer_request(
    cfg: VllmConfig,
    gguf: Path,
    requests: list[BenchRequest],
    single: BenchRequest | None,
    threads: int,
    rehearsal: list[BenchRequest] | None = None,
) -> dict[str, Any]:
    """What the script's ``run`` is told, as JSON-able values (``vllm_peer.peer_request``'s shape)."""

    def spec(r: BenchRequest) -> dict[str, Any]:
        return {"prompt_token_ids": list(r.prompt_token_ids), "max_tokens": r.max_tokens}

    return {
        "model": str(gguf),
        "threads": threads,
        "max_model_len": cfg.max_model_len,
        "warmup": cfg.bench.warmup,
        "requests": [spec(r) for r in requests],
        "rehearsal": [spec(r) for r in rehearsal or ()],
        "single": None if single is None else spec(single),
    }


def run_peer(
    cfg: VllmConfig,
    requests: list[BenchRequest],
    single: BenchRequest | None,
    threads: int,
    scratch: Path,
    rehearsal: list[BenchRequest] | None = None,
) -> dict[str, Any]:
    """Convert the checkpoint if no GGUF of it is cached, run the workload through llama.cpp in
    ``cfg.bench.peer_python``; its numbers (``main``'s output) and the GGUF's path."""
    from minivllm.bench.vllm_peer import call_peer

    if any(r.temperature not in (None, 0) or not r.ignore_eos for r in requests):
        raise ValueError(
            "bench.baseline=llamacpp: every request runs greedy with EOS ignored; the prompts_file's lines "
            "set their own temperature or ignore_eos=false (drop those keys)"
        )
    python = cfg.bench.peer_python
    gguf = gguf_path(cfg.model.path, scratch)
    if not gguf.exists():
        gguf.parent.mkdir(parents=True, exist_ok=True)
        partial = gguf.with_suffix(f".{os.getpid()}.part")
        call_peer(python, __file__, ["convert", cfg.model.path, str(partial)], peer_env(threads), "llamacpp")
        partial.replace(gguf)  # whole or absent: a killed conversion leaves no file that looks done
    with tempfile.TemporaryDirectory(prefix="minivllm-peer-") as tmp:
        inp, out = Path(tmp) / "requests.json", Path(tmp) / "result.json"
        inp.write_text(json.dumps(peer_request(cfg, gguf, requests, single, threads, rehearsal)))
        call_peer(python, __file__, ["run", str(inp), str(out)], peer_env(threads), "llamacpp")
        result = json.loads(out.read_text())
    result["gguf"] = str(gguf)
    return result


def peer_env(threads: int) -> dict[str, str]:
    """The script's environment: the peer's venv only; ``threads`` OpenMP threads unless set."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.setdefault("OMP_NUM_THREADS", str(threads))
    return env


# ---- the script: convert (gguf + numpy) --------------------------------------------------------

_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_tensor_name(hf_name: str) -> str:
    """A Hugging Face Llama parameter's name in llama.cpp's files."""
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    parts = hf_name.split(".")  # model.layers.N.<module>.<sub>.weight
    module = ".".join(parts[3:-1])
    if parts[:2] != ["model", "layers"] or module not in _LAYER_NAMES or parts[-1] != "weight":
        raise ValueError(f"{hf_name!r}: not a parameter of a Llama checkpoint llama.cpp can load")
    return f"blk.{parts[2]}.{_LAYER_NAMES[module]}.weight"


def permute_rotary_rows(w: Any, num_heads: int) -> Any:
    """llama.cpp's q/k permutation, (heads * head_dim, hidden): each head's rotate-half halves
    become interleaved pairs (``gguf_loader.unpermute_rotary_rows`` undoes it)."""
    return w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_safetensors(path: Path) -> dict[str, Any]:
    """Every tensor of a ``.safetensors`` file as a float32 numpy array (F32, F16, BF16), read
    without torch: an 8-byte header length, a JSON header, then the raw little-endian data."""
    import numpy as np

    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + size])
    data = memoryview(raw)[8 + size :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        kind = info["dtype"]
        if kind == "F32":
            values = np.frombuffer(data[start:end], dtype="<f4")
        elif kind == "F16":
            values = np.frombuffer(data[start:end], dtype="<f2").astype(np.float32)
        elif kind == "BF16":
            values = (np.frombuffer(data[start:end], dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{path}: tensor {name!r} of dtype {kind}; the llama.cpp peer converts F32/F16/BF16")
        out[name] = values.reshape(info["shape"])
    return out


def vocabulary(checkpoint: Path, vocab_size: int) -> tuple[list[str], list[int]]:
    """``vocab_size`` unique token strings and types (1 normal, 3 control, 5 unused): the
    tokenizer.json's where it has them, ``[PADn]`` for the ids it lacks."""
    tokens: dict[int, str] = {}
    control: set[int] = set()
    file = checkpoint / "tokenizer.json"
    if file.is_file():
        tok = json.loads(file.read_text())
        vocab = (tok.get("model") or {}).get("vocab")
        if isinstance(vocab, dict):
            tokens.update({i: t for t, i in vocab.items() if i < vocab_size})
        for added in tok.get("added_tokens") or ():
            if added["id"] < vocab_size:
                tokens[added["id"]] = added["content"]
                control.add(added["id"])
    seen: set[str] = set()
    names, types = [], []
    for i in range(vocab_size):
        name = tokens.get(i)
        if name is None or name in seen:
            name = f"[PAD{i}]"
        seen.add(name)
        names.append(name)
        types.append(3 if i in control else 1 if i in tokens else 5)
    return names, types


def convert(checkpoint: str, out: str) -> None:
    """Write the Llama checkpoint as an f32 GGUF at ``out``."""
    import gguf

    ckpt = Path(checkpoint)
    config = json.loads((ckpt / "config.json").read_text())
    if config.get("model_type") != "llama":
        raise ValueError(f"{ckpt}: model_type {config.get('model_type')!r}; the llama.cpp peer converts Llama only")
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise ValueError(f"{ckpt}: RoPE scaling {rope}; the llama.cpp peer converts plain RoPE only")
    writer = gguf.GGUFWriter(out, "llama")
    writer.add_name(ckpt.name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(config.get("rope_theta") or rope.get("rope_theta") or 10000.0))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    names, types = vocabulary(ckpt, config["vocab_size"])
    writer.add_tokenizer_model("llama")
    writer.add_token_list(names)
    writer.add_token_scores([0.0] * len(names))
    writer.add_token_types(types)
    for key, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id)):
        value = config.get(key)
        if isinstance(value, list):
            value = value[0] if value else None
        if value is not None:
            add(value)
    files = sorted(ckpt.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{ckpt}: no .safetensors files to convert")
    for file in files:
        for name, tensor in read_safetensors(file).items():
            if name.endswith("rotary_emb.inv_freq"):
                continue
            target = gguf_tensor_name(name)
            if ".attn_q." in target:
                tensor = permute_rotary_rows(tensor, heads)
            elif ".attn_k." in target:
                tensor = permute_rotary_rows(tensor, kv_heads)
            writer.add_tensor(target, tensor.astype("float32"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# ---- the script: run (llama_cpp) ---------------------------------------------------------------


class Runner:
    """A llama.cpp model and context sized for ``n_seqs`` sequences of ``max_len`` tokens each."""

    def __init__(self, model_path: str, n_seqs: int, max_len: int, max_prompt_tokens: int, threads: int) -> None:
        import llama_cpp as lc

        self.lc = lc
        lc.llama_backend_init()
        mparams = lc.llama_model_default_params()
        mparams.n_gpu_layers = 0
        self.model = lc.llama_model_load_from_file(model_path.encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {model_path}")
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        cparams = lc.llama_context_default_params()
        cparams.n_seq_max = n_seqs
        cparams.kv_unified = False  # a KV stream per sequence: attention over its own cells only
        cparams.n_ctx = n_seqs * max_len  # llama.cpp pads each stream to a multiple of 256 cells
        cparams.n_batch = max(max_prompt_tokens, n_seqs)  # every prompt in one llama_decode call
        cparams.n_ubatch = min(cparams.n_batch, 512)
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.type_k = cparams.type_v = lc.GGML_TYPE_F32
        cparams.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED  # exact fp32 attention (the module docstring)
        cparams.no_perf = True
        self.n_batch = cparams.n_batch
        self.ctx = lc.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create the context")
        self.batch = lc.llama_batch_init(self.n_batch, 0, 1)
        self.sampler = lc.llama_sampler_init_greedy()

    def _decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """One ``llama_decode`` of (token, position, sequence, wants logits) entries."""
        b = self.batch
        for i, (token, pos, seq, logits) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
            b.seq_id[i][0] = seq
        b.n_tokens = len(entries)
        code = self.lc.llama_decode(self.ctx, b)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code} for a batch of {len(entries)} tokens")

    def generate(self, requests: list[dict[str, Any]]) -> list[list[int]]:
        """Greedy continuations of ``requests``, all in flight together. Sequence ids go by
        ``max_tokens``, longest first, so the unfinished sequences are always ids 0..k-1: with a KV
        stream per sequence llama.cpp builds a micro-batch from consecutive sequence ids only
        (``split_equal``), and a gap would cut every later step into several weight passes."""
        if sum(len(r["prompt_token_ids"]) for r in requests) > self.n_batch:
            raise ValueError("the prompts do not fit one batch")
        order = sorted(range(len(requests)), key=lambda i: -requests[i]["max_tokens"])  # sequence -> request
        prompts = [requests[i]["prompt_token_ids"] for i in order]
        budgets = [requests[i]["max_tokens"] for i in order]
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.ctx), True)
        entries = []
        for seq, ids in enumerate(prompts):
            entries += [(t, pos, seq, pos == len(ids) - 1) for pos, t in enumerate(ids)]
        self._decode(entries)
        rows = [i for i, e in enumerate(entries) if e[3]]  # batch index of each sequence's logits
        out: list[list[int]] = [[] for _ in requests]  # by sequence
        live = list(range(len(requests)))
        while live:
            step = []
            for row, seq in zip(rows, live):
                token = self.lc.llama_sampler_sample(self.sampler, self.ctx, row)
                out[seq].append(token)
                if len(out[seq]) < budgets[seq]:
                    step.append((token, len(prompts[seq]) + len(out[seq]) - 1, seq, True))
            if not step:
                break
            live = [e[2] for e in step]
            rows = list(range(len(step)))
            self._decode(step)
        by_request: list[list[int]] = [[] for _ in requests]
        for seq, i in enumerate(order):
            by_request[i] = out[seq]
        return by_request


def main(inp: str, out: str) -> None:
    spec = json.loads(Path(inp).read_text())
    started = time.perf_counter()
    import llama_cpp

    requests, rehearsal, single = spec["requests"], spec["rehearsal"], spec["single"]
    everything = [requests, rehearsal] + ([[single]] if single else [])
    runner = Runner(
        spec["model"],
        n_seqs=max(len(group) for group in everything),
        max_len=spec["max_model_len"],
        max_prompt_tokens=max(sum(len(r["prompt_token_ids"]) for r in group) for group in everything),
        threads=spec["threads"],
    )
    result: dict[str, Any] = {
        "name": "llamacpp",
        "version": llama_cpp.__version__,
        "batch_size": len(requests),
        "startup_s": time.perf_counter() - started,
        "threads": spec["threads"],
    }
    if spec["warmup"]:
        start, start_cpu = time.perf_counter(), time.process_time()
        runner.generate([{"prompt_token_ids": requests[0]["prompt_token_ids"][:16], "max_tokens": 8}])
        if rehearsal:
            runner.generate(rehearsal)
        result["warmup"] = {"time_s": time.perf_counter() - start, "cpu_time_s": time.process_time() - start_cpu}
    if single is not None and single["max_tokens"] > 1:  # (N tokens - 1 token) / (N - 1) steps, median of three

        def clock(r: dict[str, Any]) -> float:
            start = time.perf_counter()
            runner.generate([r])
            return time.perf_counter() - start

        one = dict(single, max_tokens=1)
        step_s = statistics.median((clock(single) - clock(one)) / (single["max_tokens"] - 1) for _ in range(3))
        result.update(decode_tokens_per_s=1.0 / step_s, decode_step_ms=1e3 * step_s)
    start, start_cpu = time.perf_counter(), time.process_time()
    token_ids = runner.generate(requests)
    seconds, cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
    produced = sum(len(t) for t in token_ids)
    result.update(
        total_time_s=seconds,
        cpu_time_s=cpu_s,
        requests_per_s=len(requests) / seconds,
        input_tokens_per_s=sum(len(r["prompt_token_ids"]) for r in requests) / seconds,
        output_tokens_per_s=produced / seconds,
        output_tokens=produced,
        token_ids=token_ids,
    )
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("convert", "run"):
        sys.exit(f"usage: {sys.argv[0]} convert CHECKPOINT OUT.gguf | run REQUESTS.json RESULT.json")
    (convert if sys.argv[1] == "convert" else main)(sys.argv[2], sys.argv[3])
