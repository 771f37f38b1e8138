#!/usr/bin/env bash
# Everything that needs a CUDA GPU, in one run that fits in 8 minutes on an H100-class card.
#
#   bash scripts/gpu_check.sh              # on a machine with a GPU; installs nothing (no network needed)
#   bash scripts/gpu_check.sh --dry-run    # anywhere: the plan, each step's time limit and what it needs
#   OUT=/tmp/gpu bash scripts/gpu_check.sh # where results go (default: gpu_check_out/)
#
# $OUT/summary.md is written first -- the machine, what is missing, the plan -- and rewritten as
# each step finishes, so a run cut short still says what it did; each step's output is in
# $OUT/<step>.log. Every step runs under its own time limit (a hang costs that step, not the
# run). A step whose needs are missing (no GPU, a CPU build of torch, a package) is skipped
# with the reason, not run to fail. Exit status: 0 if every step passed, 1 otherwise.
#
#   env          the GPU, its compute capability, torch / triton / CUDA versions, what is installed
#   kernels      the kernels of tests/attention compiled on the GPU against float64 PyTorch references: float16
#                and bfloat16 (float16 alone below sm_80), decode, split-KV, prefill, the backends,
#                and the 8-bit KV cache's kernels (test_kv_int8_kernels.py: quantising writer,
#                int8 decode / split-KV / prefill)
#   ex06         exercise 06's kernel (the reference solution) compiled, against the same references
#   engine       the engine against transformers on the GPU (float32: identical greedy tokens; the
#                GPU's own 16-bit format: next-token distributions), greedy parity of the torch and
#                triton backends, a NaN-filled KV pool changing no token; the 8-bit KV cache
#                (kv_cache_dtype="int8", tests/attention/test_kv_int8.py) end to end on the GPU; the
#                synchronising CUDA calls of a decode step (set_sync_debug_mode), printed per
#                backend and held to DECODE_SYNC_BUDGET (minivllm/engine/host_syncs.py)
#   attn_bench   benchmarks/attention_kernels.py: achieved HBM bandwidth of paged decode (fraction
#                of peak), the cost of paging (same kernel, contiguous blocks); stored as
#                $OUT/results/attention_kernels-<gpu>.json (copy it into benchmarks/results/)
#   traffic      benchmarks/kernel_traffic.py: each kernel's measured time beside its predicted floor
#                (bytes per launch from minivllm/attention/traffic.py at peak bandwidth), fraction of peak
#   graphs       benchmarks/graph_decode.py: the decode forward captured as CUDA graphs (one per
#                batch bucket) and replayed, against the eager forward: speed-up, identical tokens
#   throughput   benchmarks/throughput.py: transformers static vs minivllm static vs continuous
#   notebooks    every notebook under nbval (--nbval-lax --nbval-current-env): checked outputs
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
case "${1:-}" in
    "") ;;
    --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option ${1}; use --dry-run or --help" >&2; exit 2 ;;
esac

PY="${PYTHON:-python}"
OUT="${OUT:-gpu_check_out}"
mkdir -p "$OUT" || { echo "cannot create OUT=$OUT" >&2; exit 2; }
OUT="$(cd "$OUT" && pwd)"
SUMMARY="$OUT/summary.md"
BUDGET=480  # seconds for the whole run on an H100-class GPU
export MINIVLLM_SOLUTIONS=1  # exercise checks grade the reference solutions
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's minivllm
if [[ $DRY -eq 0 ]]; then unset TRITON_INTERPRET; fi  # kernels compile for the GPU

# --- what this machine has ----------------------------------------------------------------
# One line per need: "name<TAB>ok|missing<TAB>detail". Needs: gpu (a CUDA build of torch and a
# visible device), triton (with its NVIDIA backend), and the Python packages the steps import.
probe() {
    "$PY" - <<'EOF' 2>&1
import importlib.util, platform, sys
def has(name):
    return importlib.util.find_spec(name) is not None
def line(name, ok, detail):
    print(f"{name}\t{'ok' if ok else 'missing'}\t{detail}")
print(f"python\tok\t{platform.python_version()} ({sys.executable})")
try:
    import torch
except ImportError as err:
    line("torch", False, f"torch does not import ({err}): install the project's dependencies")
    line("gpu", False, "no torch")
else:
    line("torch", True, torch.__version__)
    if torch.version.cuda is None:
        line("gpu", False, f"torch {torch.__version__} is a CPU build (torch.version.cuda is None): "
                           "install a CUDA build of torch")
    elif not torch.cuda.is_available():
        line("gpu", False, f"torch has CUDA {torch.version.cuda} but sees no GPU (driver? CUDA_VISIBLE_DEVICES?)")
    else:
        p = torch.cuda.get_device_properties(0)
        line("gpu", True, f"{p.name}, sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}")
        print(f"capability\tok\t{p.major}{p.minor}")
try:
    import triton
    ok = has("triton.backends.nvidia")
    line("triton", ok, triton.__version__ + ("" if ok else ": no NVIDIA backend in this build"))
except ImportError as err:
    line("triton", False, f"triton does not import ({err})")
for name, why in [("transformers", "reference model"), ("pytest", "tests"), ("hypothesis", "tests"),
                  ("nbval", "notebook checks"), ("ipykernel", "notebook kernel"), ("matplotlib", "notebooks"),
                  ("ipywidgets", "notebooks"), ("flash_attn", "optional: one more kernel to compare")]:
    line(name, has(name), why)
try:
    import minivllm
    line("minivllm", True, f"{minivllm.__version__} from {minivllm.__file__}")
except Exception as err:  # noqa: BLE001 - reported, not raised
    line("minivllm", False, f"does not import: {type(err).__name__}: {err}")
EOF
}
declare -A HAVE DETAIL
while IFS=$'\t' read -r name state detail; do
    [[ -n "$name" && -n "${state:-}" ]] || continue
    HAVE[$name]=$state
    DETAIL[$name]=$detail
done < <(probe)
CAPABILITY="${DETAIL[capability]:-}"
# float16 alone on a GPU without bfloat16 arithmetic (tests/attention skips bfloat16 cases itself)
EX06_FILTER=""
if [[ -n "$CAPABILITY" && "$CAPABILITY" -lt 80 ]]; then EX06_FILTER="-k 'not bf16'"; fi

# --- the plan: name | time limit (s) | needs | command ---------------------------------------
PYTEST=("$PY" -m pytest -q -p no:cacheprovider -rfE)
STEPS=(env kernels ex06 engine attn_bench traffic graphs throughput notebooks)
declare -A LIMIT NEEDS CMD
LIMIT[env]=20;         NEEDS[env]="gpu"
LIMIT[kernels]=105;    NEEDS[kernels]="gpu triton pytest hypothesis minivllm"
LIMIT[ex06]=45;        NEEDS[ex06]="gpu triton pytest hypothesis minivllm"
LIMIT[engine]=80;      NEEDS[engine]="gpu triton pytest transformers minivllm"
LIMIT[attn_bench]=60;  NEEDS[attn_bench]="gpu triton minivllm"
LIMIT[traffic]=15;     NEEDS[traffic]="gpu triton minivllm"
LIMIT[graphs]=25;      NEEDS[graphs]="gpu triton minivllm"
LIMIT[throughput]=40;  NEEDS[throughput]="gpu transformers minivllm"
LIMIT[notebooks]=90;  NEEDS[notebooks]="gpu triton pytest nbval ipykernel matplotlib ipywidgets transformers minivllm"
CMD[env]="$PY -c 'import torch, triton; p = torch.cuda.get_device_properties(0); print(p, torch.__version__, torch.version.cuda, triton.__version__)'"
CMD[kernels]="${PYTEST[*]} tests/attention --ignore=tests/attention/test_gpu_compile.py --ignore=tests/attention/test_attention_backends.py --ignore=tests/attention/test_kv_int8.py --ignore=tests/attention/test_engine_triton.py"
CMD[ex06]="${PYTEST[*]} -m ex06 tests/exercises${EX06_FILTER:+ $EX06_FILTER}"  # its notebook cases (test_cases.py) and its module
CMD[engine]="${PYTEST[*]} -s tests/engine/test_gpu_device.py tests/attention/test_attention_backends.py tests/attention/test_kv_int8.py tests/attention/test_engine_triton.py"
CMD[attn_bench]="$PY benchmarks/attention_kernels.py --out $OUT/attention_kernels.json --store $OUT/results"
CMD[traffic]="$PY benchmarks/kernel_traffic.py --batches 1 8 64 --contexts 512 4096"
CMD[graphs]="$PY benchmarks/graph_decode.py"
CMD[throughput]="$PY benchmarks/throughput.py"
CMD[notebooks]="${PYTEST[*]} --nbval-lax --nbval-current-env notebooks"

total=0
for s in "${STEPS[@]}"; do total=$((total + LIMIT[$s])); done
if (( total > BUDGET )); then
    echo "the steps' time limits add up to ${total}s, over the ${BUDGET}s budget" >&2
    exit 2
fi

missing_for() {  # the needs of step $1 that this machine lacks
    local need out=()
    for need in ${NEEDS[$1]}; do
        [[ "${HAVE[$need]:-missing}" == ok ]] || out+=("$need")
    done
    echo "${out[*]:-}"
}

declare -A STATUS SECONDS_TAKEN
for s in "${STEPS[@]}"; do STATUS[$s]="pending"; SECONDS_TAKEN[$s]=""; done

write_summary() {
    {
        echo "# GPU check ($( [[ $DRY -eq 1 ]] && echo "dry run: nothing ran" || echo "run" ))"
        echo
        echo "started $STARTED on $(hostname), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
        echo
        echo "| need | here | detail |"
        echo "|---|---|---|"
        for need in python torch gpu triton transformers pytest hypothesis nbval ipykernel matplotlib ipywidgets flash_attn minivllm; do
            echo "| $need | ${HAVE[$need]:-missing} | ${DETAIL[$need]:-not probed} |"
        done
        echo
        echo "| step | time limit | took | result | needs | command |"
        echo "|---|---:|---:|---|---|---|"
        for s in "${STEPS[@]}"; do
            echo "| $s | ${LIMIT[$s]} s | ${SECONDS_TAKEN[$s]:-} | ${STATUS[$s]} | ${NEEDS[$s]} | \`${CMD[$s]}\` |"
        done
        echo
        echo "time limits add up to ${total} s of a ${BUDGET} s budget"
    } > "$SUMMARY"
}

STARTED="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
write_summary
echo "summary: $SUMMARY"

failed=0
for s in "${STEPS[@]}"; do
    lacking="$(missing_for "$s")"
    if [[ $DRY -eq 1 ]]; then
        STATUS[$s]="would run$( [[ -n "$lacking" ]] && echo "; missing here: $lacking" )"
        printf '%-11s limit %4ss  needs: %s\n             would run: %s\n' "$s" "${LIMIT[$s]}" "${NEEDS[$s]}" "${CMD[$s]}"
        [[ -n "$lacking" ]] && for need in $lacking; do echo "             missing here: $need (${DETAIL[$need]:-not installed})"; done
        write_summary
        continue
    fi
    if [[ -n "$lacking" ]]; then
        STATUS[$s]="SKIPPED: missing $lacking"
        failed=1
        echo "== $s: skipped, missing: $lacking"
        for need in $lacking; do echo "   $need: ${DETAIL[$need]:-not installed}"; done
        write_summary
        continue
    fi
    echo "== $s (limit ${LIMIT[$s]}s): ${CMD[$s]}"
    t0=$SECONDS
    timeout --kill-after=10 "${LIMIT[$s]}" bash -c "${CMD[$s]}" > "$OUT/$s.log" 2>&1
    rc=$?
    SECONDS_TAKEN[$s]="$((SECONDS - t0)) s"
    case $rc in
        0) STATUS[$s]="ok" ;;
        124|137) STATUS[$s]="TIMED OUT after ${LIMIT[$s]} s"; failed=1 ;;
        *) STATUS[$s]="FAILED (exit $rc, see $s.log)"; failed=1 ;;
    esac
    write_summary
    echo "   ${STATUS[$s]} in ${SECONDS_TAKEN[$s]}"
    tail -n 15 "$OUT/$s.log" | sed 's/^/   | /'
done

echo
if [[ $DRY -eq 1 ]]; then
    echo "dry run: ${#STEPS[@]} steps, time limits add up to ${total}s of ${BUDGET}s; summary in $SUMMARY"
    exit 0
fi
cat "$SUMMARY"
exit $failed
