"""Train minivllm's demo model: a tiny Llama that writes Python-looking text.

minivllm needs a model to show on a machine with no network, so the project
trains its own and commits it to ``minivllm/assets/demo-llama``.

Data
    The ``.py`` files of the Python standard library of the interpreter that
    runs this script (``sysconfig.get_paths()["stdlib"]``), minus test suites,
    IDLE, installed packages and generated tables (see ``EXCLUDED_DIRS``).
    Files are read in sorted path order; every ``VAL_EVERY``-th file is held
    out for validation. Each file becomes ``<s> ...source... </s>`` and all of
    them are packed into one token stream.

Tokenizer
    A byte-level BPE (``tokenizers`` library, ``--vocab-size`` entries) with
    ``<pad>``, ``<s>`` and ``</s>``; it prepends ``<s>`` to every encoding and
    decodes whitespace and newlines exactly. Saved as a Hugging Face fast
    tokenizer, so ``AutoTokenizer.from_pretrained(out)`` works offline.

Model
    ``transformers.LlamaForCausalLM`` (used here for training only) with about
    3.4M parameters: hidden 256, 4 layers, 4 query heads sharing 2 KV heads
    (GQA), tied embeddings, RoPE theta 10000. Saved as bfloat16 safetensors
    (about 7 MB). At this budget a smaller model that sees more tokens beats
    a larger one that sees fewer.

Training
    AdamW, linear warmup then cosine decay, on batches of random windows of
    the packed stream, with bfloat16 autocast on 2 CPU threads. Training
    stops after ``--steps`` steps (2000, about 10 minutes on 2 cores) or
    ``--minutes`` of wall time, whichever comes first; the cosine schedule
    follows whichever is further along. The saved checkpoint is then reloaded
    to measure the validation loss and print greedy continuations, and a
    ``training_log.json`` with data sizes, parameters, time, losses, samples
    and the command is written next to the weights.

Rerun
    python tools/train_demo.py --minutes 0 --threads 1   # the committed checkpoint
    python tools/train_demo.py --minutes 1 --out /tmp/demo-llama   # smoke run

The seed and the file order are fixed. ``--minutes 0`` lifts the time limit,
so the run stops at the same step on a busy machine as on an idle one. The
data is whatever stdlib the interpreter has, so another Python version gives
a slightly different model; ``training_log.json`` records the one used.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import shlex
import sys
import sysconfig
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
SPECIAL_TOKENS = [PAD, BOS, EOS]  # ids 0, 1, 2
EXCLUDED_DIRS = {
    "test",
    "tests",
    "idle_test",
    "idlelib",  # test suites and the IDLE app
    "site-packages",
    "dist-packages",
    "__pycache__",  # not the stdlib
    "encodings",
    "pydoc_data",  # generated codec tables and doc strings
}
VAL_EVERY = 50
PROMPTS = ("def fibonacci(n):", "import ", "class Stack:")
REPO_ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument(
        "--out", type=Path, default=REPO_ROOT / "minivllm/assets/demo-llama", help="checkpoint directory to (over)write"
    )
    p.add_argument("--steps", type=int, default=2000, help="optimizer steps")
    p.add_argument("--minutes", type=float, default=20.0, help="training wall-time limit; 0 means none")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads", type=int, default=2, help="torch CPU threads; 1 is much faster on cores busy with other work"
    )
    data = p.add_argument_group("data and tokenizer")
    data.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    data.add_argument("--vocab-size", type=int, default=2048)
    model = p.add_argument_group("model")
    model.add_argument("--hidden", type=int, default=256)
    model.add_argument("--layers", type=int, default=4)
    model.add_argument("--heads", type=int, default=4)
    model.add_argument("--kv-heads", type=int, default=2)
    model.add_argument("--intermediate", type=int, default=688)
    model.add_argument("--max-positions", type=int, default=512)
    optim = p.add_argument_group("optimization")
    optim.add_argument("--seq-len", type=int, default=256)
    optim.add_argument("--batch", type=int, default=8, help="windows per step")
    optim.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    optim.add_argument("--min-lr-ratio", type=float, default=0.1)
    optim.add_argument("--warmup", type=int, default=100, help="warmup steps")
    optim.add_argument("--weight-decay", type=float, default=0.1)
    optim.add_argument(
        "--autocast",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="bfloat16 autocast (fast on CPUs with AMX/AVX512-BF16)",
    )
    optim.add_argument("--log-every", type=int, default=50)
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- data


def find_sources(stdlib: Path) -> list[Path]:
    """The stdlib's own .py files, in a machine-independent (sorted) order."""
    return sorted(
        path
        for path in stdlib.rglob("*.py")
        if not EXCLUDED_DIRS.intersection(path.relative_to(stdlib).parts[:-1])
        and not path.name.startswith("_sysconfigdata")  # generated build variables
    )


def read_texts(paths: list[Path]) -> list[str]:
    return [path.read_text(encoding="utf-8", errors="replace") for path in paths]


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE: every byte is in the vocabulary, so nothing is unknown
    and decode(encode(text)) == text for any text."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD)


def pack(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    """One stream of ``<s> file </s>`` for every file, as an int64 tensor."""
    encodings = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    stream: list[int] = []
    for enc in encodings:
        stream += [tokenizer.bos_token_id, *enc.ids, tokenizer.eos_token_id]
    return torch.tensor(stream, dtype=torch.long)


def random_windows(stream: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    """``batch`` windows of ``seq_len`` tokens at random offsets of the stream."""
    starts = torch.randint(0, len(stream) - seq_len, (batch,), generator=gen)
    return torch.stack([stream[s : s + seq_len] for s in starts.tolist()])


# ---------------------------------------------------------------------------- model


def build_model(args: argparse.Namespace, tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.max_positions,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


def count_params(model: torch.nn.Module) -> int:
    """Parameters counted once even when shared (tied embeddings)."""
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------- training


def make_optimizer(model: torch.nn.Module, args: argparse.Namespace) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norm gains)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95))


def learning_rate(step: int, progress: float, args: argparse.Namespace) -> float:
    """Linear warmup over ``args.warmup`` steps, then cosine decay to
    ``min_lr_ratio * lr`` as ``progress`` goes from 0 to 1."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    min_lr = args.lr * args.min_lr_ratio
    return min_lr + 0.5 * (args.lr - min_lr) * (1 + math.cos(math.pi * min(progress, 1.0)))


def train(model: LlamaForCausalLM, stream: torch.Tensor, args: argparse.Namespace) -> dict:
    """Train until the step cap or the time budget; returns summary stats."""
    optimizer = make_optimizer(model, args)
    gen = torch.Generator().manual_seed(args.seed)
    budget = args.minutes * 60
    model.train()
    start = time.perf_counter()
    step, recent = 0, collections.deque(maxlen=args.log_every)
    while step < args.steps:
        elapsed = time.perf_counter() - start
        if budget and elapsed >= budget:
            break
        progress = max(step / args.steps, elapsed / budget if budget else 0.0)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, progress, args)
        batch = random_windows(stream, args.batch, args.seq_len, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        recent.append(loss.item())
        if step % args.log_every == 0:
            log_progress(step, recent, optimizer, args, time.perf_counter() - start)
    seconds = time.perf_counter() - start
    return {
        "steps": step,
        "tokens_seen": step * args.batch * args.seq_len,
        "train_seconds": round(seconds, 1),
        "final_train_loss": round(sum(recent) / len(recent), 4),
    }


def log_progress(
    step: int, losses: collections.deque, optimizer: torch.optim.Optimizer, args: argparse.Namespace, seconds: float
) -> None:
    tok_per_s = step * args.batch * args.seq_len / seconds
    print(
        f"step {step:5d}  loss {sum(losses) / len(losses):.4f}  "
        f"lr {optimizer.param_groups[0]['lr']:.2e}  {tok_per_s:,.0f} tok/s  {seconds:6.0f}s",
        flush=True,
    )


@torch.no_grad()
def evaluate(model: LlamaForCausalLM, stream: torch.Tensor, seq_len: int, max_windows: int = 64) -> float:
    """Mean loss over the first ``max_windows`` non-overlapping windows."""
    model.eval()
    n = min(max_windows, len(stream) // seq_len)
    windows = stream[: n * seq_len].view(n, seq_len)
    losses = [model(input_ids=w, labels=w).loss.item() for w in windows.split(16)]
    return sum(losses) / len(losses)


# ----------------------------------------------------------------------- checkpoint


CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML-style, so the server answers chat out of the box (the model never saw it in
training: its replies stay Python-flavoured)."""


def save_checkpoint(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    """Save bfloat16 safetensors and a tokenizer that both transformers 4.x
    and 5.x load with ``AutoTokenizer`` (5.x names its own class otherwise)."""
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config.do_sample = False
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tokenizer.model_max_length = model.config.max_position_embeddings
    tokenizer.save_pretrained(out)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def generate_samples(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, max_new_tokens: int = 40
) -> dict[str, str]:
    """Greedy continuation of each prompt in ``PROMPTS``."""
    samples = {}
    for prompt in PROMPTS:
        inputs = tokenizer(prompt, return_tensors="pt")
        ids = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        samples[prompt] = tokenizer.decode(ids[0], skip_special_tokens=True)
    return samples


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    wall_start = time.perf_counter()

    paths = find_sources(args.stdlib)
    texts = read_texts(paths)
    train_texts = [t for i, t in enumerate(texts) if i % VAL_EVERY != VAL_EVERY - 1]
    val_texts = [t for i, t in enumerate(texts) if i % VAL_EVERY == VAL_EVERY - 1]
    tokenizer = train_tokenizer(train_texts, args.vocab_size)
    train_stream, val_stream = pack(tokenizer, train_texts), pack(tokenizer, val_texts)
    data = {
        "stdlib": str(args.stdlib),
        "python": sys.version.split()[0],
        "files_train": len(train_texts),
        "files_val": len(val_texts),
        "bytes": sum(len(t.encode()) for t in texts),
        "tokens_train": len(train_stream),
        "tokens_val": len(val_stream),
        "vocab_size": len(tokenizer),
    }
    print(json.dumps(data, indent=2), flush=True)

    model = build_model(args, tokenizer)
    print(f"model: {count_params(model):,} parameters", flush=True)
    stats = train(model, train_stream, args)
    save_checkpoint(model, tokenizer, args.out)

    # Measure and sample the checkpoint as saved (bfloat16 weights, float32 math).
    saved = LlamaForCausalLM.from_pretrained(args.out, dtype=torch.float32)
    stats["val_loss"] = round(evaluate(saved, val_stream, args.seq_len), 4)
    samples = generate_samples(saved, AutoTokenizer.from_pretrained(args.out))
    log = {
        "command": shlex.join(["python", "tools/train_demo.py", *argv]),
        "data": data,
        "params": count_params(saved),
        "hyperparameters": {k: v for k, v in vars(args).items() if not isinstance(v, Path)},
        "training": stats,
        "total_seconds": round(time.perf_counter() - wall_start, 1),
        "samples": samples,
    }
    (args.out / "training_log.json").write_text(json.dumps(log, indent=2) + "\n")

    for prompt, text in samples.items():
        print(f"\n--- {prompt!r}\n{text}")
    print(
        f"\nfinal train loss {stats['final_train_loss']}, val loss {stats['val_loss']}, "
        f"{stats['steps']} steps in {stats['train_seconds']}s "
        f"({log['total_seconds']}s total); checkpoint {args.out} "
        f"({dir_size(args.out) / 1e6:.1f} MB)"
    )


if __name__ == "__main__":
    main()
