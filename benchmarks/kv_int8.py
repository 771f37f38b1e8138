"""The 8-bit KV cache (``kv_cache_dtype="int8"``) against the model-dtype cache: accuracy and capacity.

On the tiny model and on a random-weight Qwen3-shaped model (head_dim 128, GQA, q/k norms):

(a) logit error, teacher-forced: each prompt followed by its greedy continuation (from the
    ``auto`` engine) goes through both engines as one prompt, in chunks of ``--chunk`` tokens,
    so every chunk after the first reads its context from the cache. A chunk's rows attend to
    the K/V exactly as a decode step would (their own K/V rounded as the cache holds them), so
    this compares the logits of every decode step on identical inputs. Reported: max and mean
    ``|logit_int8 - logit_auto|`` over every row and vocabulary entry;
(b) greedy agreement with Hugging Face transformers (tiny model): per prompt, the first
    position where the engine's greedy tokens differ from ``generate``'s, or "identical";
(c) perplexity on held-out stories (``scripts/tiny_corpus.py``, the held-out seed of
    ``scripts/train_tiny_model.py``, documents of the training set removed) through the engine's
    ``prompt_logprobs``, in chunks, so that later chunks read the cache;
(d) capacity at equal memory: the same ``kv_cache_memory`` for both caches, many requests with
    long outputs: KV blocks, peak running requests, preemptions, output tokens/s;
(e) where the scale lives: the real K/V the float32 cache holds after a trace, rounded to 8 bits
    with one scale per token and KV head (the format) and with one per block and KV head (the
    alternative), relative error of each.

    python benchmarks/kv_int8.py            # the figures in docs/benchmarks.md, "8-bit KV cache"
    python benchmarks/kv_int8.py --quick    # a smaller trace (about a minute)
    python benchmarks/kv_int8.py --json out.json

``measure(...)`` returns the same figures as a dict (for a notebook, on a small trace).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

import minivllm
from minivllm import LLM, SamplingParams
from minivllm.engine.core_client import local_core
from minivllm.model.config import ModelConfig

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
HELDOUT_SEED = 10_000  # scripts/train_tiny_model.py: held-out documents come from seed + 10_000
TRAIN_DOCS, TRAIN_SEED = 70_000, 0  # its defaults, to drop held-out documents it trained on


def qwen3_checkpoint(out: Path, hidden: int = 512, layers: int = 4, seed: int = 0) -> Path:
    """A random-weight Qwen3-shaped checkpoint (head_dim 128, 4 query heads over 2 KV heads,
    q/k RMSNorm) with the tiny model's tokenizer, saved by transformers."""
    import transformers as tf

    vocab = ModelConfig.from_file(minivllm.TINY_MODEL_DIR).vocab_size
    cfg = tf.Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=128, max_position_embeddings=2048,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = tf.Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # wider than the default init: peaked distributions, as a trained model
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.05)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copy(Path(minivllm.TINY_MODEL_DIR) / name, out / name)
    return out


def random_prompts(n: int, vocab: int, seed: int, low: int = 8, high: int = 96) -> list[list[int]]:
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, vocab) for _ in range(rng.randint(low, high))] for _ in range(n)]


def story_prompts(n: int, words: int = 12) -> list[str]:
    """The first ``words`` words of held-out stories: prompts the tiny model continues sensibly."""
    return [" ".join(doc.split()[:words]) for doc in heldout_stories(n)]


def heldout_stories(n: int) -> list[str]:
    """The first ``n`` held-out documents that are not in the training set."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import tiny_corpus

    train = set(tiny_corpus.generate_corpus(TRAIN_DOCS, seed=TRAIN_SEED))
    docs = [d for d in tiny_corpus.generate_corpus(4 * n, seed=TRAIN_SEED + HELDOUT_SEED) if d not in train]
    return docs[:n]


def engine(model: str, kv_cache_dtype: str, **kwargs) -> LLM:
    return LLM(model, kv_cache_dtype=kv_cache_dtype, dtype="float32", seed=0, **kwargs)


def capture_logits(llm: LLM) -> list[torch.Tensor]:
    """Every logits row the model computes from now on, in order (prompt rows included)."""
    model = local_core(llm).executor.model
    rows: list[torch.Tensor] = []
    compute = model.compute_logits

    def recording(hidden):
        out = compute(hidden)
        rows.append(out.detach().float().cpu())
        return out

    model.compute_logits = recording
    return rows


def logit_error(model: str, prompts: list[list[int]], new_tokens: int, chunk: int) -> dict:
    """(a): teacher-forced logits of int8 vs auto on prompt + the auto engine's greedy continuation."""
    args = dict(max_model_len=1024, num_kv_blocks=512, max_num_batched_tokens=chunk, enable_prefix_caching=False)
    greedy = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    auto = engine(model, "auto", **args)
    seqs = [p + o.outputs[0].token_ids for p, o in zip(prompts, auto.generate(prompts, greedy, use_tqdm=False),
                                                        strict=True)]
    forced = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, prompt_logprobs=0)
    logits = {}
    for kind in ("auto", "int8"):
        llm = engine(model, kind, **args)
        rows = capture_logits(llm)
        llm.generate(seqs, forced, use_tqdm=False)
        logits[kind] = torch.cat(rows)
    diff = (logits["int8"] - logits["auto"]).abs()
    top = logits["int8"].argmax(-1) == logits["auto"].argmax(-1)
    return dict(rows=int(diff.shape[0]), max_abs=float(diff.max()), mean_abs=float(diff.mean()),
                logit_std=float(logits["auto"].std()), top1_agreement=float(top.float().mean()))


def hf_agreement(prompts: list[list[int]], new_tokens: int) -> dict:
    """(b): per prompt, the first position where the engine's greedy tokens leave transformers'."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(minivllm.TINY_MODEL_DIR, dtype=torch.float32).eval()
    want = []
    with torch.no_grad():  # plain greedy argmax, end-of-text included (generate's min_new_tokens would mask it)
        for p in prompts:
            ids = torch.tensor([p])
            for _ in range(new_tokens):
                ids = torch.cat([ids, hf(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            want.append(ids[0, len(p):].tolist())
    result = {}
    greedy = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    for kind in ("auto", "int8"):
        llm = engine(minivllm.TINY_MODEL_DIR, kind, max_model_len=1024, num_kv_blocks=512, max_num_batched_tokens=64)
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
        result[kind] = [next((i for i, (a, b) in enumerate(zip(g, w, strict=True)) if a != b), "identical")
                        for g, w in zip(got, want, strict=True)]
    return result


def perplexity(stories: list[str], chunk: int) -> dict:
    """(c): held-out perplexity from prompt_logprobs, the prompt fed in chunks of ``chunk`` tokens."""
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    out = {}
    for kind in ("auto", "int8"):
        llm = engine(minivllm.TINY_MODEL_DIR, kind, max_model_len=1024, num_kv_blocks=1024,
                     max_num_batched_tokens=chunk, enable_prefix_caching=False)
        total, count = 0.0, 0
        for o in llm.generate(stories, params, use_tqdm=False):
            for entry in o.prompt_logprobs[1:]:  # position 0 (<s>) has none
                total += next(iter(entry.values())).logprob
                count += 1
        out[kind] = math.exp(-total / count)
    out["tokens"] = count
    return out


def capacity(model: str, memory: int, requests: int, prompt_len: int, output_len: int) -> dict:
    """(d): the same KV memory for both caches, a memory-bound trace (long outputs)."""
    vocab = ModelConfig.from_file(model).vocab_size
    prompts = random_prompts(requests, vocab, seed=1, low=prompt_len, high=prompt_len)
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    rows = {}
    for kind in ("auto", "int8"):
        llm = engine(model, kind, kv_cache_memory=memory, max_model_len=prompt_len + output_len + 16,
                     max_num_seqs=256, enable_prefix_caching=False)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        stats = llm.stats()
        summary = stats.summary()
        rows[kind] = dict(num_blocks=local_core(llm).kv.num_blocks, peak_running=max(stats.column("num_running")),
                          mean_running=summary["mean_batch_seqs"],
                          preemptions=summary["preemptions"], output_tokens=sum(len(o.outputs[0].token_ids) for o in outs),
                          wall_s=wall)
        rows[kind]["output_tok_s"] = rows[kind]["output_tokens"] / wall
    rows["ratio"] = {k: rows["int8"][k] / rows["auto"][k]
                     for k in ("num_blocks", "peak_running", "mean_running", "output_tok_s")}
    return rows


def scale_granularity(model: str, prompts: list[list[int]], new_tokens: int, block_size: int = 16) -> dict:
    """(e): relative RMS error of the K and V a float32 cache holds after a trace, rounded to
    8 bits with a scale per token and KV head, and with a scale per block and KV head."""
    from minivllm.attention.kv_quant import round_trip

    llm = engine(model, "auto", max_model_len=1024, num_kv_blocks=512, block_size=block_size,
                 enable_prefix_caching=False)
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True), use_tqdm=False)
    errors: dict = {"per token": [0.0, 0.0], "per block": [0.0, 0.0]}  # squared error, squared norm
    for k_cache, v_cache in local_core(llm).executor.kv_caches:
        for cache in (k_cache, v_cache):
            # blocks the trace wrote (a freed block keeps its values; unused ones are all zero)
            used = cache[cache.abs().flatten(1).amax(1) > 0].double()  # [n, block_size, KVH, D]
            norm = float((used**2).sum())
            token = round_trip(used.float()).double()
            scale = used.abs().amax(dim=(1, 3), keepdim=True) / 127  # one per block and KV head
            block = (used / scale.clamp(min=1e-30)).round().clamp(-127, 127) * scale
            for name, approx in (("per token", token), ("per block", block)):
                errors[name][0] += float(((approx - used) ** 2).sum())
                errors[name][1] += norm
    return {name: math.sqrt(e / n) for name, (e, n) in errors.items()}


def measure(quick: bool = False, chunk: int = 16, seed: int = 0, qwen3: bool = True) -> dict:
    """Every figure of the benchmark as a dict: ``{"logit_error": {model: ...}, "hf_agreement":
    ..., "perplexity": ..., "capacity": {model: ...}}``."""
    torch.set_num_threads(1)
    n_prompts, new_tokens = (4, 24) if quick else (8, 48)
    tiny = minivllm.TINY_MODEL_DIR
    stories = heldout_stories(8 if quick else 32)
    tiny_prompts = [minivllm_tokenize(t) for t in story_prompts(n_prompts)]
    result: dict = {"settings": dict(quick=quick, chunk=chunk, prompts=n_prompts, new_tokens=new_tokens)}
    models = {"tiny": tiny}
    tmp = None
    if qwen3:
        tmp = Path(tempfile.mkdtemp(prefix="kv_int8_qwen3_"))
        models["qwen3-shaped"] = str(qwen3_checkpoint(tmp))
    try:
        vocab = ModelConfig.from_file(tiny).vocab_size
        result["logit_error"] = {}
        for name, path in models.items():
            prompts = tiny_prompts if name == "tiny" else random_prompts(n_prompts, vocab, seed)
            result["logit_error"][name] = logit_error(path, prompts, new_tokens, chunk)
        result["hf_agreement"] = hf_agreement(tiny_prompts, new_tokens)
        result["perplexity"] = perplexity(stories, 4 * chunk)
        result["scale_granularity"] = {name: scale_granularity(path, tiny_prompts if name == "tiny" else
                                                               random_prompts(n_prompts, vocab, seed), new_tokens)
                                       for name, path in models.items()}
        result["capacity"] = {}
        for name, path in models.items():
            cfg = ModelConfig.from_file(path)
            per_token = cfg.kv_bytes_per_token(4)
            # room for about 12 full requests in the float32 cache
            prompt_len, output_len = 32, (96 if quick else 192)
            memory = 12 * (prompt_len + output_len) * per_token
            result["capacity"][name] = capacity(path, memory, 48 if quick else 96, prompt_len, output_len)
            result["capacity"][name]["kv_cache_memory"] = memory
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return result


def minivllm_tokenize(text: str) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(minivllm.TINY_MODEL_DIR) / "tokenizer.json"))
    return tok.encode(text).ids


def print_tables(r: dict) -> None:
    s = r["settings"]
    print(f"(a) logits, teacher-forced: {s['prompts']} prompts + {s['new_tokens']} greedy tokens each, "
          f"chunks of {s['chunk']} tokens (float32 model; auto = float32 cache)\n")
    print("| model | rows | max abs error | mean abs error | logits' std | top-1 agreement |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, e in r["logit_error"].items():
        print(f"| {name} | {e['rows']} | {e['max_abs']:.4f} | {e['mean_abs']:.5f} | {e['logit_std']:.2f} "
              f"| {e['top1_agreement']:.1%} |")
    print(f"\n(b) greedy tokens vs transformers (tiny model, {s['new_tokens']} tokens): first divergence per prompt\n")
    print("| cache | per prompt |")
    print("|---|---|")
    for kind, firsts in r["hf_agreement"].items():
        print(f"| {kind} | {', '.join(str(f) for f in firsts)} |")
    p = r["perplexity"]
    print(f"\n(c) held-out perplexity (tiny model, {p['tokens']} tokens, prompt_logprobs in chunks of "
          f"{4 * s['chunk']})\n")
    print("| auto | int8 | int8 / auto - 1 |")
    print("|---:|---:|---:|")
    print(f"| {p['auto']:.5f} | {p['int8']:.5f} | {p['int8'] / p['auto'] - 1:+.2e} |")
    print("\n(d) capacity at equal kv_cache_memory (prompts of 32 tokens, long outputs)\n")
    print("| model | KV memory | cache | blocks | peak running | mean running per step | preemptions | output tok/s |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for name, c in r["capacity"].items():
        for kind in ("auto", "int8"):
            row = c[kind]
            print(f"| {name} | {c['kv_cache_memory'] / 2**20:.2f} MiB | {kind} | {row['num_blocks']} "
                  f"| {row['peak_running']} | {row['mean_running']:.1f} | {row['preemptions']} | {row['output_tok_s']:.0f} |")
        q = c["ratio"]
        print(f"| {name} | | int8/auto | {q['num_blocks']:.2f}x | {q['peak_running']:.2f}x | "
              f"{q['mean_running']:.2f}x | | {q['output_tok_s']:.2f}x |")


def print_granularity(r: dict) -> None:
    print("\n(e) where the scale lives: relative RMS error of the cached K and V rounded to 8 bits\n")
    print("| model | a scale per token and KV head | a scale per block (16 tokens) and KV head | ratio |")
    print("|---|---:|---:|---:|")
    for name, g in r["scale_granularity"].items():
        print(f"| {name} | {g['per token']:.4f} | {g['per block']:.4f} | {g['per block'] / g['per token']:.2f}x |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smaller trace")
    ap.add_argument("--chunk", type=int, default=16, help="tokens per prefill chunk in (a); 4x that in (c)")
    ap.add_argument("--no-qwen3", action="store_true", help="the tiny model only")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(f"$ python benchmarks/kv_int8.py {' '.join(sys.argv[1:] if argv is None else argv)}\n")
    t0 = time.perf_counter()
    result = measure(quick=args.quick, chunk=args.chunk, qwen3=not args.no_qwen3)
    print_tables(result)
    print_granularity(result)
    print(f"\n{time.perf_counter() - t0:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
