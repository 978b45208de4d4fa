#!/usr/bin/env bash
# The whole GPU session in one script: prove the CUDA paths, then measure.
#
#   bash tools/gpu_session.sh --core          # first call (~8 min): what decides speed, beside nano-vllm
#   bash tools/gpu_session.sh --correctness   # second call: pytest -m gpu, the demo graphs vs eager
#   bash tools/gpu_session.sh [--quick] [--stages a,b,c,d1,d2,d3,d4,d5,d6,d7,n1,n2,p,m]
#
# --core runs a,n1,n2,p,m (limits 40+215+130+65+90 = 540 s: give the call timeout_s 570),
# --correctness b,c. Core stages:
#   n1  bench=nanovllm on nano-vllm's exact request instance (bench.workload=jsonl, the file
#       python -m minivllm.bench.workloads nanovllm writes), the defaults then
#       scheduler.async_scheduling=false; each run's floor (copy bandwidth by CUDA events over
#       1 GiB, prefill by FLOPs at the measured GEMM rate), prefill and decode seconds apart
#   n2  nano-vllm itself on the same instance (tools/nanovllm_peer.py; its checkout in
#       third_party/nano-vllm or $NANOVLLM_DIR, carried): the last of the timings
#   p   benchmarks/profile_decode.py with graphs and compile on: batch 256 x 1024, batch 32 x 1024
#   m   benchmarks/sampler.py, benchmarks/attention.py at the workload's context lengths,
#       fused MoE and int4/fp8 GEMMs; on its own (--stages m, limit 480 s) it first tunes the MoE
#       and int4 tiles and the fp8 GEMM's choice on this GPU (--tune: tables into minivllm/tuned_tiles/tables and m/tuned_tables),
#       inside --core it runs the tables as they are (the call's 600 s leave no room to tune).
#       The GEMM tables print each quantized time against bf16 (int4 also its act-order path,
#       the general kernel) and the goals' verdicts: int4 >= 2x and fp8 >= 1.5x bf16 at M <= 16,
#       fused MoE >= the torch loop at every token count
#
# Stages (docs/gpu.md says what each writes and how to read it):
#   a   environment: GPU, versions, Triton's launcher toolchain, the conf link, disk
#   b   python3 -m pytest -m gpu -q (tests needing a package this machine lacks are skipped)
#   c   the demo model through python3 -m minivllm with CUDA graphs and eager: same text?
#   d1  bench=nanovllm with CUDA graphs (the default) and eager
#   d2  bench=nanovllm with compilation.torch_compile on, and with async scheduling off
#   d3  transformers generate vs minivllm on a scaled-down nanovllm workload
#   d4  benchmarks/attention.py: decode bandwidth at batch 1/64/256, contexts 512-4096, a prefill;
#       benchmarks/mla_decode.py: MLA decode (% of copy bandwidth) and --prefill;
#       benchmarks/gated_delta_rule.py: Qwen3-Next's delta rule, decode bandwidth and prefill TFLOP/s
#   d5  benchmarks/profile_decode.py: 10 full-batch decode steps, kernels by group
#   d6  benchmarks/moe.py and benchmarks/quant_gemm.py: fused MoE, int4 and fp8 GEMMs vs torch,
#       after tuning both kernels' tiles on this GPU (--tune: the tables in minivllm/tuned_tiles/tables);
#       benchmarks/moe.py --gpt-oss: gpt-oss-20b's biased, clamped experts
#   d7  bench=multimodal at LLaVA-1.5-7B's and Qwen2-VL-2B's shapes (dummy weights, native image
#       sizes); the tiny LLaVA with CUDA graphs and eager: same text?
#   (d = d1..d7; --quick: a,b,c,d1,d4 at smaller sizes, under 5 minutes)
#
# Each stage runs under `timeout` into $GPU_SESSION_WORK/<stage>/ (log.txt, metrics.json,
# one folder per Hydra run); a broken stage never stops the later ones. After every
# stage, $OUT gets summary.json, summary.txt and session.tar.gz (all stage folders):
# three files, since a device call brings back at most eight. Carried wheels in .whl/
# are installed into /tmp/site (on PYTHONPATH) when hydra does not import.
#
# Environment: OUT (default outputs/gpu_session), PYTHON (python3), GPU_SESSION_WORK
# (/tmp/gpu_session), GPU_SESSION_CPU_TRY=1 (no GPU: tiny shapes, CUDA-only parts skipped
# and reported so), GPU_SESSION_FAIL_STAGES="b d4" (those stages fail on purpose: tests
# of this script), GPU_SESSION_TIMEOUT_<STAGE>=seconds (a stage's limit, e.g. _D1),
# GPU_SESSION_RUNS_<STAGE>="graphs sync" (which bench runs d1/d2 make, of graphs, eager,
# compile, sync), GPU_SESSION_BENCH_ARGS="k=v ..." (added to every bench run),
# GPU_SESSION_PYTEST_ARGS="-n 8" (added to stage b's pytest), GPU_SESSION_WARM=0 (no
# Triton warm-up run before the timed ones: they warm up each engine themselves),
# GPU_SESSION_RUNS_D7="llava graphs" (which of llava, qwen2_vl, graphs d7 runs),
# GPU_SESSION_D7_ARGS="k=v ..." (added to d7's bench runs), GPU_SESSION_TUNE=0 (d6 without
# tuning), GPU_SESSION_TUNE_MOE_S / GPU_SESSION_TUNE_INT4_S (the tuning budgets: d6 40 and 25 s,
# m 60 and 80 s; the int4 one is shared with the fp8 GEMM's), GPU_SESSION_TUNE_M=0 (m without tuning).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
export ROOT
export PYTHON=${PYTHON:-python3}
export OUT=${OUT:-$ROOT/outputs/gpu_session}
export WORK=${GPU_SESSION_WORK:-/tmp/gpu_session}
export CPU_TRY=${GPU_SESSION_CPU_TRY:-0}
export QUICK=0
FAIL_STAGES=" ${GPU_SESSION_FAIL_STAGES:-} "
ALL_STAGES=(a b c d1 d2 d3 d4 d5 d6 d7)
QUICK_STAGES=(a b c d1 d4)
CORE_STAGES=(a n1 n2 p m)
CORRECTNESS_STAGES=(b c)
declare -A LIMIT=([a]=90 [b]=330 [c]=150 [d1]=440 [d2]=400 [d3]=360 [d4]=295 [d5]=380 [d6]=280 [d7]=240
  [n1]=215 [n2]=130 [p]=65 [m]=480)
declare -A QUICK_LIMIT=([a]=40 [b]=90 [c]=60 [d1]=70 [d2]=120 [d3]=90 [d4]=40 [d5]=60 [d6]=60 [d7]=200
  [n1]=120 [n2]=60 [p]=60 [m]=60)
declare -A CORE_LIMIT=([a]=40 [b]=420 [c]=120 [m]=90)  # --core / --correctness: a and m shorter, b and c their own call

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

STAGES=()
PRESET=""
while (($#)); do
  case "$1" in
    --quick) QUICK=1 ;;
    --core) PRESET=core; STAGES=("${CORE_STAGES[@]}") ;;
    --correctness) PRESET=correctness; STAGES=("${CORRECTNESS_STAGES[@]}") ;;
    --stages) shift; IFS=, read -r -a STAGES <<<"${1:-}" ;;
    --stages=*) IFS=, read -r -a STAGES <<<"${1#--stages=}" ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_session.sh: unknown argument '$1' (--core, --correctness, --quick, --stages a,b,...,d7,n1,n2,p,m)" >&2; exit 2 ;;
  esac
  shift
done
if ((${#STAGES[@]} == 0)); then
  if ((QUICK)); then STAGES=("${QUICK_STAGES[@]}"); else STAGES=("${ALL_STAGES[@]}"); fi
fi
expanded=()
for s in "${STAGES[@]}"; do
  if [[ $s == d ]]; then expanded+=(d1 d2 d3 d4 d5 d6 d7); continue; fi
  if [[ -z ${LIMIT[$s]+x} ]]; then
    echo "gpu_session.sh: unknown stage '$s' (stages: ${ALL_STAGES[*]}, or d for d1-d7)" >&2; exit 2
  fi
  expanded+=("$s")
done
STAGES=("${expanded[@]}")
export SESSION_PRESET=$PRESET

# ---- environment -------------------------------------------------------------------------
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
install_wheels() {
  # The machine's image lacks hydra-core, omegaconf and antlr4: carried as .whl/*.whl.
  if "$PYTHON" -c "import hydra, omegaconf" 2>/dev/null; then
    echo "wheels: hydra and omegaconf import already; nothing installed"; return 0
  fi
  if ! compgen -G "$ROOT/.whl/*.whl" >/dev/null; then
    echo "wheels: hydra is missing and no .whl/*.whl was carried (shared/gpu/fetch-wheels.sh builds them)" >&2
    return 1
  fi
  local site=${GPU_SESSION_SITE:-/tmp/site}
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" "$ROOT"/.whl/*.whl || return 1
  export PYTHONPATH="$site:$PYTHONPATH"
  echo "wheels: installed $(ls "$ROOT"/.whl/*.whl | wc -l) into $site"
}
install_wheels
mkdir -p "$WORK" "$OUT"
for s in "${STAGES[@]}"; do rm -rf "${WORK:?}/$s"; done  # earlier stages' folders stay (and travel in the tarball)
if ((CPU_TRY)); then echo "CPU try: tiny shapes, CUDA-only parts skipped"; fi

# Engine shapes: the real ones, or a 2-layer version of the same model on the CPU.
engine_args() {  # sets the arrays BENCH and SHRINK in the calling shell
  BENCH=(task=bench bench=nanovllm model=qwen3-0.6b load.format=dummy bench.progress=false)
  SHRINK=()
  if ((CPU_TRY)); then
    SHRINK=(device=cpu +model.hf_overrides.num_hidden_layers=2 +model.hf_overrides.hidden_size=64
      +model.hf_overrides.intermediate_size=128 +model.hf_overrides.vocab_size=512
      +model.hf_overrides.num_attention_heads=4 +model.hf_overrides.num_key_value_heads=2
      +model.hf_overrides.head_dim=16 bench.num_prompts=4 bench.min_input_len=8 bench.max_input_len=16
      bench.min_output_len=4 bench.max_output_len=8 bench.single_input_len=8 bench.single_output_len=4)
  fi
}

# ---- stages (each runs in its own bash under `timeout`, in $STAGE_DIR, output to log.txt) ----
stage_a() {
  nvidia-smi || echo "nvidia-smi: not found or failed"
  "$PYTHON" -m tools.gpu_session.env_check "$STAGE_DIR" $( ((CPU_TRY)) && echo --cpu-try)
}

stage_b() {
  local targets=(tests) expect=(--expect-passes)
  if ((QUICK)); then
    targets=(tests/attention/test_triton_paged_attention.py tests/worker/test_cuda_graphs.py
      tests/layers/test_fused_small_ops.py)
  fi
  if ((CPU_TRY)); then expect=(); fi
  # a hanging test fails alone (pytest-timeout) instead of taking the stage's junit.xml with it
  if "$PYTHON" -c "import pytest_timeout" 2>/dev/null; then targets+=(--timeout=150); fi
  read -r -a extra <<<"${GPU_SESSION_PYTEST_ARGS:-}"
  targets+=("${extra[@]}")
  "$PYTHON" -m pytest -m gpu -q -p tools.gpu_session.skip_missing -p no:cacheprovider \
    --junitxml="$STAGE_DIR/junit.xml" "${targets[@]}"
  local rc=$?
  "$PYTHON" -m tools.gpu_session.stage_metrics pytest "$STAGE_DIR" "${expect[@]}" || rc=1
  return $rc
}

stage_c() {
  printf '%s\n' "def fibonacci(n):" "class Stack:" "import os" "for line in open(" "def main():" \
    >"$STAGE_DIR/prompts.txt"
  local run common=(prompts_file="$STAGE_DIR/prompts.txt" sampling.max_tokens=64 +sampling.ignore_eos=true)
  for run in graphs eager; do
    echo "== $run"
    "$PYTHON" -m minivllm "${common[@]}" compilation.cudagraph=$([[ $run == graphs ]] && echo true || echo false) \
      hydra.run.dir="$STAGE_DIR/$run"
  done
  "$PYTHON" -m tools.gpu_session.stage_metrics demo "$STAGE_DIR" graphs eager
}

minivllm_run() {  # NAME SECONDS OVERRIDES...: one python -m minivllm run into $STAGE_DIR/NAME
  local name=$1 limit=$2; shift 2
  echo "== bench run $name (limit ${limit}s): $*"
  # --foreground: stay in the stage's process group, so the stage's own timeout reaches this run too
  timeout --foreground --kill-after=10 "$limit" "$PYTHON" -m minivllm "$@" hydra.run.dir="$STAGE_DIR/$name"
  echo "== bench run $name: exit $?"
}

bench_run() {  # NAME SECONDS OVERRIDES...: one task=bench bench=nanovllm run into $STAGE_DIR/NAME
  local name=$1 limit=$2 BENCH SHRINK extra; shift 2
  engine_args
  read -r -a extra <<<"${GPU_SESSION_BENCH_ARGS:-}"
  minivllm_run "$name" "$limit" "${BENCH[@]}" "$@" "${extra[@]}" "${SHRINK[@]}"
}

warm_triton() {
  # Triton compiles each kernel variant once per machine (its cache outlives the process):
  # a short eager run of the same shapes compiles prefill, mixed and decode variants at many
  # batch sizes, so no timed run pays for a compile. The mark lives in Triton's cache.
  local mark="${TRITON_CACHE_DIR:-$HOME/.triton/cache}/.minivllm_bench_warm"
  if ((CPU_TRY || QUICK)) || [[ ${GPU_SESSION_WARM:-1} == 0 || -e $mark ]]; then return 0; fi
  bench_run warmup 120 compilation.cudagraph=false bench.num_prompts=64 bench.min_output_len=16 \
    bench.max_output_len=48 bench.single_request=false
  mkdir -p "$(dirname "$mark")" && touch "$mark"  # once, even if it failed: the timed runs will say why
}

# The bench configurations d1 and d2 compare: a name, its limit (s) and its overrides.
bench_config() {  # NAME -> runs it
  case "$1" in
    graphs) bench_run graphs 120 ;;  # CUDA's defaults: graphs on, async scheduling on
    eager) bench_run eager 180 compilation.cudagraph=false ;;
    compile) bench_run compile 150 compilation.torch_compile=true ;;
    sync) bench_run sync 120 scheduler.async_scheduling=false ;;
    *) echo "unknown bench run '$1' (graphs, eager, compile, sync)" >&2; return 2 ;;
  esac
}

bench_stage() {  # STAGE DEFAULT_RUNS...: the runs GPU_SESSION_RUNS_<STAGE> names, else the defaults
  local var="GPU_SESSION_RUNS_${1^^}" runs run; shift
  read -r -a runs <<<"${!var:-$*}"
  warm_triton
  if ((QUICK)); then runs=(graphs); fi
  for run in "${runs[@]}"; do
    if ((QUICK)); then bench_run graphs 60 bench.num_prompts=64; else bench_config "$run"; fi
  done
  "$PYTHON" -m tools.gpu_session.stage_metrics bench "$STAGE_DIR" "${runs[@]}"
}

stage_d1() { bench_stage d1 graphs eager; }

stage_d2() { bench_stage d2 compile sync; }

stage_d3() {
  # The full workload through generate takes far too long: 32 requests, outputs up to 512.
  warm_triton
  local n=(bench.num_prompts=32 bench.max_output_len=512 bench.hf_batch_size=8)
  if ((QUICK)); then n=(bench.num_prompts=8 bench.max_output_len=128 bench.hf_batch_size=8); fi
  bench_run hf_vs_minivllm 230 bench.baseline=hf "${n[@]}"
  "$PYTHON" -m tools.gpu_session.stage_metrics bench "$STAGE_DIR" hf_vs_minivllm
}

stage_d4() {
  local args=(--dtype bf16 --num-heads 16 --num-kv-heads 8 --head-dim 128 --json "$STAGE_DIR/metrics.json")
  if ((CPU_TRY)); then args=(--cpu-smoke --json "$STAGE_DIR/metrics.json"); fi
  if ((QUICK && !CPU_TRY)); then args+=(--batches 1 256 --contexts 4096 --small-batch 0); fi
  "$PYTHON" benchmarks/attention.py "${args[@]}" || return
  if ((!CPU_TRY && !QUICK)); then  # the engine's bench=nanovllm runs use 256-token blocks
    echo "== 256-token blocks"
    "$PYTHON" benchmarks/attention.py --batches 256 --contexts 1024 4096 --small-batch 0 --block-size 256 \
      --num-heads 16 --num-kv-heads 8 --head-dim 128 --json "$STAGE_DIR/block256.json" || true
    echo "== MLA decode over DeepSeek V3's latent cache (% of copy bandwidth), then MLA prefill chunks"
    timeout --foreground 60 "$PYTHON" benchmarks/mla_decode.py | tee "$STAGE_DIR/mla_decode.txt" || true
    timeout --foreground 45 "$PYTHON" benchmarks/mla_decode.py --prefill | tee "$STAGE_DIR/mla_prefill.txt" || true
  fi
  if ((!CPU_TRY && !QUICK)); then  # Qwen3-Next's linear attention: decode % of copy bandwidth, prefill TFLOP/s
    echo "== gated delta rule (Qwen3-Next-80B's linear-attention layer)"
    timeout --foreground 40 "$PYTHON" benchmarks/gated_delta_rule.py --json "$STAGE_DIR/gated_delta_rule.json" || true
  fi
}

stage_d5() {
  warm_triton
  if ((CPU_TRY)); then
    "$PYTHON" benchmarks/profile_decode.py --tiny --json "$STAGE_DIR/metrics.json"; return
  fi
  local steps=(--steps 10)
  if ((QUICK)); then steps=(--steps 5 --batch 64); fi
  # eager first: the kernels a graph replays are the same, and eager shows them even where
  # the profiler cannot see inside a graph; the graphs run's summary is the stage's metrics
  timeout --foreground 120 "$PYTHON" benchmarks/profile_decode.py "${steps[@]}" --eager --json "$STAGE_DIR/eager.json" \
    >"$STAGE_DIR/eager.txt" 2>&1 || echo "eager profile failed: see eager.txt"
  timeout --foreground 120 "$PYTHON" benchmarks/profile_decode.py "${steps[@]}" --json "$STAGE_DIR/metrics.json"
}
stage_d6() {
  local moe=() quant=(--json "$STAGE_DIR/quant_gemm.json")
  if ((CPU_TRY)); then moe=(--cpu-smoke); quant+=(--cpu-smoke); fi
  if ((QUICK && !CPU_TRY)); then moe+=(--tokens 1 256); quant+=(--tokens 1 128); fi
  if ((CPU_TRY || QUICK)) || [[ ${GPU_SESSION_TUNE:-1} != 1 ]]; then
    echo "== tile tuning skipped (CPU try, --quick or GPU_SESSION_TUNE=0): the kernels run the tables as they are"
  else
    # Each writes the winners into minivllm/tuned_tiles/tables/ (under this GPU's name); the
    # benchmarks below then run with them. Copies land in the stage folder, to be committed.
    tune_tables "${GPU_SESSION_TUNE_MOE_S:-40}" "${GPU_SESSION_TUNE_INT4_S:-25}"
  fi
  echo "== fused MoE"
  "$PYTHON" benchmarks/moe.py "${moe[@]}" --json "$STAGE_DIR/moe.json"
  local rc=$?
  echo "== gpt-oss's experts (biases, clamped SwiGLU): the fused kernel against its torch loop"
  timeout --foreground 60 "$PYTHON" benchmarks/moe.py --gpt-oss "${moe[@]}" --json "$STAGE_DIR/moe_gpt_oss.json" || rc=1
  echo "== int4 and fp8 GEMMs"
  "$PYTHON" benchmarks/quant_gemm.py "${quant[@]}" || rc=1
  "$PYTHON" -m tools.gpu_session.stage_metrics kernels "$STAGE_DIR" moe.json quant_gemm.json || rc=1
  return $rc
}
stage_d7() {
  # Real shapes on dummy weights (tools/vlm_shapes.py: config, tokenizer, processor), images at
  # the model's native size; the CPU try runs the same on tools/tiny_vlm.py's shapes
  local runs run shape limit size built names=() tok="$STAGE_DIR/tokenizer" extra
  read -r -a runs <<<"${GPU_SESSION_RUNS_D7:-llava qwen2_vl graphs}"
  read -r -a extra <<<"${GPU_SESSION_D7_ARGS:-}"
  local mm=(task=bench bench=multimodal load.format=dummy bench.progress=false bench.num_prompts=64
    bench.min_input_len=32 bench.max_input_len=64 bench.min_output_len=64 bench.max_output_len=64)
  if ((QUICK)); then mm+=(bench.num_prompts=16); fi
  if ((CPU_TRY)); then
    mm+=(device=cpu bench.num_prompts=4 bench.min_input_len=8 bench.max_input_len=16 bench.min_output_len=4
      bench.max_output_len=8 cache.num_gpu_blocks_override=64 scheduler.max_num_batched_tokens=256)
  fi
  for run in "${runs[@]}"; do
    case "$run" in
      llava) shape=llava-1.5-7b limit=100; if ((CPU_TRY)); then shape=tiny-llava; fi ;;
      qwen2_vl) shape=qwen2-vl-2b limit=90; if ((CPU_TRY)); then shape=tiny-qwen2-vl; fi ;;
      graphs)
        echo "== tiny LLaVA: CUDA graphs vs eager (limit 70s)"
        timeout --foreground --kill-after=10 70 "$PYTHON" -m tools.gpu_session.vlm_graphs "$STAGE_DIR" \
          --tokenizer "$tok" || echo "== graphs vs eager: exit $?"
        continue ;;
      *) echo "unknown d7 run '$run' (llava, qwen2_vl, graphs)" >&2; return 2 ;;
    esac
    names+=("$shape")
    built="$STAGE_DIR/checkpoints/$shape"
    size=$("$PYTHON" -m tools.vlm_shapes "$shape" "$built" --tokenizer "$tok" --print image_size | tail -n 1)
    if [[ ! $size =~ ^[0-9]+$ ]]; then echo "== building $shape failed"; continue; fi
    minivllm_run "$shape" "$limit" "${mm[@]}" model.path="$built" bench.image_size="$size" "${extra[@]}"
  done
  "$PYTHON" -m tools.gpu_session.stage_metrics multimodal "$STAGE_DIR" "${names[@]}"
}
# ---- the core call's stages ------------------------------------------------------------------
stage_n1() {
  # nano-vllm's exact instance, one file both engines replay; the CPU try writes a toy instance
  # its 512-token shrunken vocabulary can take
  local instance="$STAGE_DIR/nanovllm.jsonl"
  if ((CPU_TRY)); then
    "$PYTHON" - "$instance" <<'PY' || return
import sys
from pathlib import Path
from minivllm.bench.workloads import BenchRequest, write_jsonl
write_jsonl([BenchRequest([(7 * i + j) % 500 for j in range(8 + i)], 4, temperature=0.6) for i in range(4)], Path(sys.argv[1]))
PY
  else
    "$PYTHON" -m minivllm.bench.workloads nanovllm "$instance" || return
  fi
  local exact=(bench.workload=jsonl bench.prompts_file="$instance") runs=()
  read -r -a runs <<<"${GPU_SESSION_RUNS_N1:-graphs sync}"
  for run in "${runs[@]}"; do
    case "$run" in
      graphs) bench_run graphs 110 "${exact[@]}" ;;  # the defaults: graphs, async scheduling
      sync) bench_run sync 100 "${exact[@]}" scheduler.async_scheduling=false bench.single_request=false ;;
      # not in the default list (the core call has no room): GPU_SESSION_RUNS_N1="multistep"
      multistep) bench_run multistep 110 "${exact[@]}" scheduler.num_scheduler_steps=8 ;;
      *) echo "unknown n1 run '$run' (graphs, sync, multistep)" >&2; return 2 ;;
    esac
  done
  "$PYTHON" -m tools.gpu_session.stage_metrics bench "$STAGE_DIR" "${runs[@]}"
}

stage_n2() {
  if ((CPU_TRY)); then
    echo '{"status": "skipped (CPU try: nano-vllm needs CUDA)"}' >"$STAGE_DIR/peer.json"
    "$PYTHON" -m tools.nanovllm_peer --help >/dev/null || return
    "$PYTHON" -m tools.gpu_session.stage_metrics peer "$STAGE_DIR"; return 0
  fi
  timeout --foreground --kill-after=10 120 "$PYTHON" -m tools.nanovllm_peer --work "$STAGE_DIR/peer" \
    --json "$STAGE_DIR/peer.json" --timeout 110
  "$PYTHON" -m tools.gpu_session.stage_metrics peer "$STAGE_DIR"
}

stage_p() {
  local big=(--batch 256 --context 1024 --steps 10) small=(--batch 32 --context 1024 --steps 10)
  if ((CPU_TRY)); then big=(--tiny --batch 4); small=(--tiny --batch 2); fi
  timeout --foreground --kill-after=5 40 "$PYTHON" benchmarks/profile_decode.py "${big[@]}" --json "$STAGE_DIR/profile.json"
  timeout --foreground --kill-after=5 25 "$PYTHON" benchmarks/profile_decode.py "${small[@]}" --json "$STAGE_DIR/batch32.json"
  "$PYTHON" -m tools.gpu_session.stage_metrics profile "$STAGE_DIR"
}

tune_tables() {  # LIMIT_MOE_S LIMIT_INT4_S: --tune both kernels' tiles; copies into the stage folder
  echo "== tuning the fused-MoE tiles (budget ${1}s)"
  timeout --kill-after=10 $(($1 + 30)) "$PYTHON" benchmarks/moe.py --tune --tune-only --tune-budget-s "$1" \
    || echo "== MoE tuning: exit $?"
  echo "== tuning the int4 tiles (budget ${2}s)"
  timeout --kill-after=10 $(($2 + 30)) "$PYTHON" benchmarks/quant_gemm.py --tune --tune-only --tune-budget-s "$2" \
    || echo "== int4 tuning: exit $?"
  mkdir -p "$STAGE_DIR/tuned_tables" && cp minivllm/tuned_tiles/tables/*.json "$STAGE_DIR/tuned_tables/" 2>/dev/null
}
stage_m() {
  local sampler=(--vocab 151936 --batches 1 32 256 --repeats 5) attention moe=() quant=(--json "$STAGE_DIR/quant_gemm.json")
  attention=(--batches 32 256 --contexts 600 1100 1600 --small-batch 0 --mixed 256 100 2048 --block-size 256
    --num-heads 16 --num-kv-heads 8 --head-dim 128 --json "$STAGE_DIR/attention.json")
  if ((CPU_TRY)); then
    sampler=(--vocab 512 --batches 1 4 --repeats 2); attention=(--cpu-smoke --mixed 3 5 40 --json "$STAGE_DIR/attention.json")
    moe=(--cpu-smoke); quant+=(--cpu-smoke)
  fi
  local moe_s=90 quant_s=150  # alone: room for Triton to compile every config the benchmarks launch
  if [[ $SESSION_PRESET == core ]]; then moe_s=30 quant_s=25; fi  # inside the core call's 90 s
  if ((CPU_TRY)) || [[ $SESSION_PRESET == core || ${GPU_SESSION_TUNE_M:-1} != 1 ]]; then
    echo "== tile tuning skipped (CPU try, --core or GPU_SESSION_TUNE_M=0): the tuned tables as they are"
  else
    tune_tables "${GPU_SESSION_TUNE_MOE_S:-60}" "${GPU_SESSION_TUNE_INT4_S:-80}"  # int4 and fp8 share the second
  fi
  read -r -a extra <<<"${GPU_SESSION_SAMPLER_ARGS:-}"
  echo "== sampler"
  timeout --foreground 20 "$PYTHON" benchmarks/sampler.py "${sampler[@]}" "${extra[@]}" | tee "$STAGE_DIR/sampler.txt"
  echo "== attention at the workload's context lengths (256-token blocks)"
  timeout --foreground 20 "$PYTHON" benchmarks/attention.py "${attention[@]}"
  echo "== fused MoE against the torch loop"
  timeout --foreground "$moe_s" "$PYTHON" benchmarks/moe.py "${moe[@]}" --json "$STAGE_DIR/moe.json"
  echo "== int4 and fp8 GEMMs against bf16"
  timeout --foreground "$quant_s" "$PYTHON" benchmarks/quant_gemm.py "${quant[@]}"
  "$PYTHON" -m tools.gpu_session.stage_metrics micro "$STAGE_DIR"
}

export -f stage_n1 stage_n2 stage_p stage_m tune_tables
export -f engine_args minivllm_run bench_run warm_triton bench_config bench_stage stage_a stage_b stage_c stage_d1 stage_d2 stage_d3 stage_d4 stage_d5 stage_d6 stage_d7

# ---- the runner ----------------------------------------------------------------------------
refresh_out() {
  "$PYTHON" -m tools.gpu_session.summary write "$WORK" "$OUT" "${STAGES[@]}" >"$WORK/summary.txt" 2>&1
  tar -czf "$OUT/session.tar.gz" -C "$(dirname "$WORK")" "$(basename "$WORK")" 2>/dev/null
}

run_stage() {
  local stage=$1 dir="$WORK/$1" limit
  limit=${LIMIT[$stage]}
  if ((QUICK)); then limit=${QUICK_LIMIT[$stage]}; fi
  if [[ -n $PRESET && -n ${CORE_LIMIT[$stage]+x} ]]; then limit=${CORE_LIMIT[$stage]}; fi
  local var="GPU_SESSION_TIMEOUT_${stage^^}"
  limit=${!var:-$limit}
  mkdir -p "$dir"
  echo "== stage $stage: limit ${limit}s, log in $dir/log.txt"
  local start=$SECONDS cmd="stage_$stage"
  if [[ $FAIL_STAGES == *" $stage "* ]]; then cmd="echo 'failing on purpose: GPU_SESSION_FAIL_STAGES'; exit 3"; fi
  STAGE_DIR="$dir" timeout --kill-after=15 "$limit" bash -c "$cmd" >"$dir/log.txt" 2>&1
  local rc=$?
  "$PYTHON" -m tools.gpu_session.summary finish "$dir" "$stage" "$rc" "$((SECONDS - start))"
  if ((rc != 0)); then
    echo "== stage $stage: exit $rc after $((SECONDS - start)) s; the log ends:"
    tail -n 15 "$dir/log.txt" | cut -c1-300
  else
    echo "== stage $stage: ok in $((SECONDS - start)) s"
  fi
  refresh_out
}

for stage in "${STAGES[@]}"; do
  run_stage "$stage"
done
echo
cat "$WORK/summary.txt"
echo "(summary.json, summary.txt and session.tar.gz in $OUT)"
