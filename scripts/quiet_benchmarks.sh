#!/usr/bin/env bash
# The serving and vLLM comparisons that need a quiet machine, one after the other (~14 minutes on
# 2 CPU cores): their figures are ratios measured side by side, and another process on the cores
# moves them by tens of percent.
#
#   bash scripts/quiet_benchmarks.sh              # nothing else running; vLLM's venv from scripts/setup_vllm_venv.sh
#   bash scripts/quiet_benchmarks.sh --dry-run    # the plan: each step's command, estimate and time limit
#   VLLM_PY=/path/to/venv/bin/python OUT=/tmp/quiet bash scripts/quiet_benchmarks.sh
#
# Each step's full output goes to $OUT/<step>.log (default OUT=quiet_benchmarks_out/), and
# $OUT/summary.md is rewritten after every step: the 1-minute load average as the step started,
# its exit status and its time. A step that runs past its limit is stopped and the run goes on.
# Exit status: 0 if every step passed, 1 otherwise.
#
#   serving_vllm   benchmarks/serving.py --vllm-python: vLLM's own client (vllm.benchmarks.serve,
#                  random dataset, 128 tokens in / 128 out, 200 requests per rate) against
#                  `minivllm serve` (its defaults, then --cpu-threads 2) and `vllm serve` on the
#                  tiny model, at saturation and at 8, 16 and 24 requests/s    (~6 min)
#   vs_vllm_equal  benchmarks/vs_vllm.py --equal-threads: the offline engines, each one's default
#                  threads, 1 vs 1, 2 vs 2; best of 2 rounds                    (~4 min)
#   vs_vllm_busy   benchmarks/vs_vllm.py --busy: the same beside a CPU-bound competitor   (~3.5 min)
#   delta_outputs  benchmarks/delta_outputs.py: the cost of an output token at 100 and 10,000
#                  tokens into an answer, delta and cumulative outputs          (~0.5 min)
#   soak           benchmarks/soak.py --requests 1000: wrong tokens and leaked blocks   (~0.5 min)
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
case "${1:-}" in
    "") ;;
    --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option ${1}; use --dry-run or --help" >&2; exit 2 ;;
esac

PY="${PYTHON:-python}"
VLLM_PY="${VLLM_PY:-$HOME/.cache/minivllm/vllm-venv/bin/python}"
OUT="${OUT:-quiet_benchmarks_out}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's minivllm

# --- the plan: name | estimate on a quiet 2-core machine (s) | time limit (s) | command --------
STEPS=(serving_vllm vs_vllm_equal vs_vllm_busy delta_outputs soak)
declare -A ESTIMATE LIMIT CMD
ESTIMATE[serving_vllm]=360;  LIMIT[serving_vllm]=900
ESTIMATE[vs_vllm_equal]=240; LIMIT[vs_vllm_equal]=600
ESTIMATE[vs_vllm_busy]=210;  LIMIT[vs_vllm_busy]=600
ESTIMATE[delta_outputs]=30;  LIMIT[delta_outputs]=300
ESTIMATE[soak]=30;           LIMIT[soak]=300
CMD[serving_vllm]="$PY benchmarks/serving.py --vllm-python $VLLM_PY --num-prompts 200 --rates inf 8 16 24 --minivllm-args '' --minivllm-args '--cpu-threads 2' --json $OUT/serving_vllm.json"
CMD[vs_vllm_equal]="$PY benchmarks/vs_vllm.py --vllm-python $VLLM_PY --equal-threads --repeats 2"
CMD[vs_vllm_busy]="$PY benchmarks/vs_vllm.py --vllm-python $VLLM_PY --busy --repeats 2"
CMD[delta_outputs]="$PY benchmarks/delta_outputs.py --length 10000"
CMD[soak]="$PY benchmarks/soak.py --requests 1000"

total=0
for s in "${STEPS[@]}"; do total=$((total + ESTIMATE[$s])); done

if [[ $DRY -eq 1 ]]; then
    echo "plan (estimates on a quiet 2-core machine; about $((total / 60)) minutes in all):"
    for s in "${STEPS[@]}"; do
        printf '  %-14s ~%4ss (limit %ss)  %s\n' "$s" "${ESTIMATE[$s]}" "${LIMIT[$s]}" "${CMD[$s]}"
    done
    if "$VLLM_PY" -c 'import vllm' 2>/dev/null; then
        echo "vLLM: $("$VLLM_PY" -c 'import vllm; print(vllm.__version__)' 2>/dev/null) at $VLLM_PY"
    else
        echo "vLLM does not import at VLLM_PY=$VLLM_PY: run scripts/setup_vllm_venv.sh first"
    fi
    exit 0
fi

if ! "$VLLM_PY" -c 'import vllm' 2>/dev/null; then
    echo "vLLM does not import at VLLM_PY=$VLLM_PY: run scripts/setup_vllm_venv.sh (or set VLLM_PY)" >&2
    exit 2
fi
mkdir -p "$OUT" || { echo "cannot create OUT=$OUT" >&2; exit 2; }
SUMMARY="$OUT/summary.md"

declare -A STATUS TAKEN LOAD
for s in "${STEPS[@]}"; do STATUS[$s]="pending"; TAKEN[$s]=""; LOAD[$s]=""; done

write_summary() {
    local s
    {
        echo "# Quiet benchmarks, $(date -u '+%Y-%m-%d %H:%M UTC')"
        echo
        echo "$(nproc) CPUs; git $(git rev-parse --short HEAD 2>/dev/null || echo '?'); vLLM at $VLLM_PY"
        echo
        echo "| step | load avg at start | status | time (s) | estimate (s) | log |"
        echo "|---|---:|---|---:|---:|---|"
        for s in "${STEPS[@]}"; do
            echo "| $s | ${LOAD[$s]} | ${STATUS[$s]} | ${TAKEN[$s]} | ${ESTIMATE[$s]} | $s.log |"
        done
    } > "$SUMMARY"
}

failed=0
write_summary
for s in "${STEPS[@]}"; do
    LOAD[$s]="$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo '?')"
    STATUS[$s]="running"
    write_summary
    echo "== $s (load average ${LOAD[$s]}; about ${ESTIMATE[$s]}s, limit ${LIMIT[$s]}s)"
    echo "\$ ${CMD[$s]}" > "$OUT/$s.log"
    start=$SECONDS
    timeout --kill-after=30 "${LIMIT[$s]}" bash -c "${CMD[$s]}" >> "$OUT/$s.log" 2>&1
    rc=$?
    TAKEN[$s]=$((SECONDS - start))
    case $rc in
        0) STATUS[$s]="passed" ;;
        124|137) STATUS[$s]="**stopped at the ${LIMIT[$s]}s limit**"; failed=1 ;;
        *) STATUS[$s]="**failed (exit $rc)**"; failed=1 ;;
    esac
    write_summary
    echo "   ${STATUS[$s]} in ${TAKEN[$s]}s; tail of $OUT/$s.log:"
    tail -n 12 "$OUT/$s.log" | sed 's/^/   /'
done
echo "summary: $SUMMARY"
exit $failed
