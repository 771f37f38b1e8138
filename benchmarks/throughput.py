"""End-to-end throughput: one request trace, three ways of serving it, in one run.

1. Hugging Face ``transformers`` ``generate`` in static batches of ``B`` (left-padded, every
   sequence decoded until the longest output of its batch is done: the straggler problem);
2. minivllm with the static-batching scheduler and a contiguous KV cache (the same policy, in
   our engine);
3. minivllm with continuous batching over the paged KV cache.

Every request asks for exactly its trace output length (``ignore_eos``), greedy. Throughput
counts only the tokens requests asked for (padding and post-finish tokens are waste).

    python benchmarks/throughput.py [--requests 96] [--batch 8] [--seed 0] [--skip-hf] [--device cuda]

Both engines run on the same device in the same dtype: float32 on a CPU, on a GPU what
``LLM(dtype="auto")`` picks there (bfloat16, or float16 on a T4).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import minivllm
from minivllm import LLM
from minivllm.course.runtime import engine_dtype
from minivllm.workloads import LogNormalLengths, chat

# The tiny model's context is 2048 tokens; a ShareGPT-shaped trace scaled down by ~2.5x keeps
# the run to a couple of minutes on a laptop CPU while keeping its long tail.
PROMPT = LogNormalLengths(mean=64, sigma=0.8, low=4, high=512)
OUTPUT = LogNormalLengths(mean=128, sigma=0.9, low=4, high=768)


def run_hf(trace, vocab: int, batch: int, device: str, dtype: torch.dtype) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(minivllm.TINY_MODEL_DIR, dtype=dtype).to(device).eval()
    items = list(trace)
    t0 = time.perf_counter()
    for i in range(0, len(items), batch):
        group = items[i : i + batch]
        prompts = [it.prompt_token_ids(vocab) for it in group]
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(group), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(prompts):  # left padding, as decoder-only batching requires
            ids[r, width - len(p) :] = torch.tensor(p)
            mask[r, width - len(p) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        new = max(it.output_len for it in group)
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, eos_token_id=None, pad_token_id=0)
    _sync(device)
    return time.perf_counter() - t0


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_minivllm(trace, vocab: int, **engine_args) -> tuple[float, dict]:
    # the same thread count as transformers got: a side-by-side comparison
    llm = LLM(cpu_threads=torch.get_num_threads(), **engine_args)
    prompts = [it.prompt_token_ids(vocab) for it in trace]
    params = [it.sampling_params() for it in trace]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # warm-up
    llm.reset_stats()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    _sync(str(llm.engine.device))
    elapsed = time.perf_counter() - t0
    assert [len(o.outputs[0].token_ids) for o in outs] == [it.output_len for it in trace]
    return elapsed, llm.stats().summary()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--batch", type=int, default=8, help="static batch size B")
    ap.add_argument("--max-num-seqs", type=int, default=128, help="continuous batching seat limit")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    dtype_name = "float32" if args.device == "cpu" else engine_dtype(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"$ python benchmarks/throughput.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    trace = chat(args.requests, seed=args.seed, prompt=PROMPT, output=OUTPUT, name="tput")
    vocab = minivllm.model.ModelConfig.from_file(minivllm.TINY_MODEL_DIR).vocab_size
    useful = trace.num_output_tokens
    print(trace.describe())
    where = f"torch threads: {torch.get_num_threads()}" if args.device == "cpu" else args.device
    print(f"{where}, {dtype_name}\n")
    rows = []
    if not args.skip_hf:
        t = run_hf(trace, vocab, args.batch, args.device, getattr(torch, dtype_name))
        rows.append((f"transformers generate, static B={args.batch}", t, None))
    on = dict(device=args.device, dtype=dtype_name)
    t, s = run_minivllm(trace, vocab, scheduler="static", kv_cache="contiguous",
                        max_num_seqs=args.batch, max_model_len=1536, **on)
    rows.append((f"minivllm static B={args.batch}, contiguous KV", t, s))
    t, s = run_minivllm(trace, vocab, max_num_seqs=args.max_num_seqs, max_model_len=1536, **on)
    rows.append((f"minivllm continuous + paged (max {args.max_num_seqs} seqs)", t, s))
    base = rows[0][1]
    print("| engine | time (s) | useful output tok/s | vs first row | mean seqs per step |")
    print("|---|---:|---:|---:|---:|")
    for name, t, s in rows:
        seqs = f"{s['mean_batch_seqs']:.1f}" if s else "—"
        print(f"| {name} | {t:.1f} | {useful / t:.0f} | {base / t:.2f}x | {seqs} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
