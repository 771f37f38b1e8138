#!/usr/bin/env bash
# Every check that needs a CUDA GPU, in one run, each step's log and a summary under $OUT.
#
#   bash scripts/gpu_check.sh              # on a machine with a GPU and the project installed
#   bash scripts/gpu_check.sh --install    # first: pip install torch (CUDA build) and the project
#   OUT=/tmp/gpu bash scripts/gpu_check.sh # where the results go (default: gpu_check_out/)
#
# What runs, in order (a step that fails does not stop the others; the exit code is 1 if any did):
#   env          the device, its compute capability, torch / triton / CUDA versions
#   kernels      tests/kernels with the Triton kernels compiled (not interpreted) against the
#                PyTorch references, exercise 06's kernel, the engine on the Triton backend
#   engine       model parity with transformers, the engine and the sampler, on the GPU
#                (dtype auto: bfloat16 on sm_80+, float16 on a T4)
#   attn_bench   benchmarks/attention_kernels.py: achieved HBM bandwidth of paged decode,
#                the cost of paging, SDPA for comparison (JSON in $OUT/attention_kernels.json)
#   throughput   benchmarks/throughput.py: transformers static vs minivllm static vs continuous
#   mixed        benchmarks/mixed_steps.py on the GPU: mixed prefill/decode steps per backend
#   notebooks    notebooks 05, 06 and 08 top to bottom (kernels compiled), outputs not written
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-gpu_check_out}"
mkdir -p "$OUT"
unset TRITON_INTERPRET  # kernels compile for the GPU
export MINIVLLM_SOLUTIONS=1  # exercise checks grade the reference solutions

if [[ "${1:-}" == "--install" ]]; then
    python -m pip install -q torch==2.13.0 && python -m pip install -q -e ".[dev]" \
        || { echo "install failed" | tee "$OUT/summary.txt"; exit 1; }
fi

: > "$OUT/summary.txt"
failed=0
step() {  # step NAME COMMAND...: run, log to $OUT/NAME.log, record rc and seconds
    local name=$1; shift
    local t0=$SECONDS
    echo "== $name: $*"
    "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    printf '%-11s rc=%-3s %5ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$*" | tee -a "$OUT/summary.txt"
    [[ $rc -eq 0 ]] || failed=1
    tail -n 25 "$OUT/$name.log"
}

step env python - <<'EOF'
import torch, triton
assert torch.cuda.is_available(), "no CUDA device: this script is for a GPU machine"
props = torch.cuda.get_device_properties(0)
print(f"device: {props.name}, sm_{props.major}{props.minor}, {props.total_memory / 2**30:.0f} GiB")
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}")
print(f"bf16 supported: {torch.cuda.is_bf16_supported()}")
EOF
if ! grep -q "^env  *rc=0 " "$OUT/summary.txt"; then
    echo "no usable GPU: nothing else to run" | tee -a "$OUT/summary.txt"
    exit 1
fi

step kernels python -m pytest -q -x tests/kernels tests/exercises/test_ex06_triton_kernel.py \
    tests/test_engine_triton.py
step engine python -m pytest -q tests/test_model_parity.py tests/test_engine.py tests/test_sampler.py \
    tests/test_logprobs.py tests/test_beam_search.py
step attn_bench python benchmarks/attention_kernels.py --out "$OUT/attention_kernels.json"
step throughput python benchmarks/throughput.py
step mixed python benchmarks/mixed_steps.py
step notebooks python scripts/run_notebooks.py --check-only notebooks/05_paged_attention_torch.ipynb \
    notebooks/06_paged_attention_triton.ipynb notebooks/08_serving_loop.ipynb

echo "summary ($OUT/summary.txt):"
cat "$OUT/summary.txt"
exit $failed
