"""Serve one token-id trace with the real vLLM and report the outputs and the time, as JSON.

This file runs inside vLLM's own virtualenv (made by ``scripts/setup_vllm_venv.sh``), started as
a subprocess by ``benchmarks/vs_vllm.py``; it imports only the standard library and vLLM, never
minivllm, so the two engines share nothing but the model directory and the trace.

    <vllm-venv>/bin/python benchmarks/vllm_driver.py REQUEST.json RESULT.json

REQUEST.json::

    {"model": "<model dir>", "prompts": [[token ids], ...], "max_tokens": [int, ...],
     "warmup_requests": int, "warmup_max_tokens": int,
     "llm_args": {"max_num_seqs": 64, "max_model_len": 1024, "dtype": "float32", ...}}

RESULT.json::

    {"vllm_version": str, "torch_version": str, "torch_threads": int, "env": {...},
     "worker": {"torch_threads": int, "cores": [int, ...], "pid": int},
     "load_s": float, "warmup_s": float, "elapsed_s": float, "outputs": [[token ids], ...]}

Every request is greedy (temperature 0) and ignores EOS, so it produces exactly its
``max_tokens`` tokens, as minivllm's side of the comparison does. vLLM's log goes to stderr;
the result goes only to RESULT.json, so nothing vLLM prints can corrupt it.
"""

from __future__ import annotations

import json
import os
import sys
import time

# Both must be set before vLLM is imported. The in-process engine (no engine-core process)
# keeps the whole run in this one process, like minivllm's; 2 GiB of KV cache holds every
# sequence of the trace (64 seats x 800 tokens x 4 layers x 2 KV heads x 32 x 2 x 4 B is
# about 105 MB).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1":
    # Lets collective_rpc send worker_threads (a function, so pickled) to the worker process
    # over vLLM's local socket; only this script talks to that socket.
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

# Settings that decide how many cores vLLM computes on; recorded with the result.
THREAD_ENV = (
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_CPU_OMP_THREADS_BIND",
    "VLLM_CPU_NUM_OF_RESERVED_CPU",
    "OMP_NUM_THREADS",
)


def worker_threads(worker) -> dict:
    """Runs inside vLLM's model worker (which is another process with multiprocessing on)."""
    import torch

    return {"torch_threads": torch.get_num_threads(), "cores": sorted(os.sched_getaffinity(0)),
            "pid": os.getpid()}


def run(request: dict) -> dict:
    """Load vLLM on the request's model, warm it up, then time one ``generate`` of the trace."""
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
              for n in request["max_tokens"]]

    t0 = time.perf_counter()
    llm = LLM(model=request["model"], **request["llm_args"])
    load_s = time.perf_counter() - t0
    try:
        worker = llm.collective_rpc(worker_threads)[0]
    except Exception as exc:  # noqa: BLE001 - only informative; the benchmark goes on
        worker = {"error": f"{type(exc).__name__}: {exc}"}

    n_warm = request["warmup_requests"]
    warm_params = SamplingParams(temperature=0.0, max_tokens=request["warmup_max_tokens"],
                                 ignore_eos=True)
    t0 = time.perf_counter()
    llm.generate(prompts[:n_warm], warm_params, use_tqdm=False)
    warmup_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed_s = time.perf_counter() - t0

    return {
        "vllm_version": vllm.__version__,
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "env": {k: os.environ.get(k) for k in THREAD_ENV},
        "worker": worker,
        "load_s": load_s,
        "warmup_s": warmup_s,
        "elapsed_s": elapsed_s,
        "outputs": [list(o.outputs[0].token_ids) for o in outs],
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: vllm_driver.py REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    request_path, result_path = argv
    with open(request_path) as f:
        request = json.load(f)
    result = run(request)
    with open(result_path, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":  # vLLM's CPU backend may spawn processes that re-import this file
    sys.exit(main(sys.argv[1:]))
