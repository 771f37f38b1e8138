"""Do mixed steps cost what their tokens cost? One forward step of the tiny model, per backend.

Continuous batching with chunked prefill puts a prompt (or a chunk) and many decode tokens in
the same step. Attention that pads every sequence to the step's longest query and longest
context (``torch_padded``) makes such a step cost as if every decode were a prompt; attention
without padding across sequences (``torch``) should make it cost the prompt plus the decodes.

Part 1, one step through the real model forward (``LlamaFamilyModel`` with the tiny
checkpoint, metadata built over a KV pool as the model runner builds it, LM head on each
sequence's last row): a prompt of ``P`` tokens alone, ``D`` decode tokens alone (contexts of
200-400 tokens), and both in one step. The step passes when::

    time(mixed) <= 1.5 * (time(prompt alone) + time(decodes alone))

Part 2, the three reported scenarios, through ``LLM.generate`` (one output token, so the time
is the prefill): a 950-token prompt alone, with 7 short prompts (77 tokens in all), and eight
950-token prompts.

Times are medians over ``--repeats`` runs, the cases of one table interleaved so that a busy
moment of the machine hits them alike. Each table is run with every ``--threads`` setting.

    python benchmarks/mixed_steps.py [--quick] [--threads 1 2] [--repeats 7]
"""

from __future__ import annotations

import argparse
import random
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from minivllm import LLM, SamplingParams
from minivllm.attention import AttentionMetadata
from minivllm.model.loader import load_model

BACKENDS = ("torch", "torch_padded")
MAX_RATIO = 1.5
BLOCK_SIZE = 16
DECODE_CONTEXT = (200, 400)  # decode rows' context lengths are drawn from this range


@dataclass
class StepShape:
    """One step: ``rows[i] = (new tokens, tokens already cached)`` for sequence ``i``."""

    rows: list[tuple[int, int]]

    @property
    def num_tokens(self) -> int:
        return sum(q for q, _ in self.rows)


def prompt_step(num_tokens: int) -> StepShape:
    return StepShape([(num_tokens, 0)])


def decode_step(num_decodes: int, seed: int = 0) -> StepShape:
    rng = random.Random(seed)
    return StepShape([(1, rng.randint(*DECODE_CONTEXT)) for _ in range(num_decodes)])


def mixed_step(prompt_tokens: int, num_decodes: int, seed: int = 0) -> StepShape:
    """Decodes first, then the prompt: the order in which the scheduler lists running requests
    before a newly admitted one."""
    return StepShape(decode_step(num_decodes, seed).rows + prompt_step(prompt_tokens).rows)


class ForwardStep:
    """The tiny model with one attention backend and a KV pool, on ``device`` in ``dtype``
    (the CPU in float32 by default); ``run(shape)`` builds that step's inputs and metadata and
    runs the forward pass and the LM head, as the model runner does (on a GPU it waits for the
    step's kernels to finish, so that a timing of ``run`` is the step's)."""

    def __init__(self, backend: str, num_blocks: int, device: str | torch.device = "cpu",
                 dtype: str | torch.dtype = "float32"):
        self.device = torch.device(device)
        self.model, _ = load_model(dtype=dtype, device=self.device, attention_backend=backend)
        self.model.allocate_kv_cache(num_blocks, BLOCK_SIZE)
        self.num_blocks = num_blocks
        self.vocab = self.model.config.vocab_size

    def inputs(self, shape: StepShape) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """``input_ids [T]``, ``positions [T]``, metadata, and each sequence's last row."""
        needed = sum(-(-(q + c) // BLOCK_SIZE) for q, c in shape.rows)
        if needed > self.num_blocks:
            raise ValueError(f"step needs {needed} KV blocks, the pool has {self.num_blocks}")
        ids, positions, slots, tables, last_rows = [], [], [], [], []
        next_block = 0
        for q, c in shape.rows:
            n_blocks = -(-(q + c) // BLOCK_SIZE)
            table = list(range(next_block, next_block + n_blocks))
            next_block += n_blocks
            for p in range(c, c + q):
                positions.append(p)
                slots.append(table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE)
                ids.append((7 * p + 3 * q + 11) % self.vocab)  # the same prompt gets the same ids
            tables.append(table)
            last_rows.append(len(ids) - 1)
        meta = AttentionMetadata.build([q for q, _ in shape.rows], [q + c for q, c in shape.rows], tables,
                                       slots, BLOCK_SIZE, self.device)
        return (torch.tensor(ids, device=self.device), torch.tensor(positions, device=self.device), meta,
                last_rows)

    @torch.inference_mode()
    def run(self, shape: StepShape) -> None:
        ids, positions, meta, last_rows = self.inputs(shape)
        hidden = self.model(ids, positions, meta)
        self.model.compute_logits(hidden[last_rows])
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the step's time, not the time to queue it


def padded_bytes(shape: StepShape, num_heads: int) -> int:
    """Rough peak of ``torch_padded``'s attention temporaries for this step: fp32 scores,
    probabilities and bias over the ``[seqs, heads, max_query, max_context]`` rectangle."""
    max_q = max(q for q, _ in shape.rows)
    max_k = max(q + c for q, c in shape.rows)
    return 3 * 4 * len(shape.rows) * num_heads * max_q * max_k


def interleaved_medians(cases: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Run every case once (warm-up), then ``repeats`` rounds of all cases in turn; return each
    case's median wall time in seconds."""
    for fn in cases.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def verdict(mixed: float, prompt: float, decodes: float) -> tuple[float, str]:
    """``(ratio, verdict)``: the mixed step's time over the sum of its parts' times."""
    ratio = mixed / (prompt + decodes)
    return ratio, "ok" if ratio <= MAX_RATIO else "over"


def mixed_table(prompt_sizes: list[int], decode_counts: list[int], repeats: int, max_gib: float) -> list[str]:
    num_blocks = max(prompt_sizes) // BLOCK_SIZE + max(decode_counts) * (DECODE_CONTEXT[1] // BLOCK_SIZE + 1) + 8
    lines = [
        "| backend | P | D | prompt alone (ms) | decodes alone (ms) | mixed (ms) | mixed / (alone + alone) | verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for backend in BACKENDS:
        runner = ForwardStep(backend, num_blocks)
        heads = runner.model.config.num_heads
        for p in prompt_sizes:
            for d in decode_counts:
                need = padded_bytes(mixed_step(p, d), heads) / 2**30
                if backend == "torch_padded" and need > max_gib:
                    lines.append(f"| {backend} | {p} | {d} | | | | | skipped: the padded rectangle needs "
                                 f"~{need:.0f} GiB (--max-padded-gib {max_gib:g}) |")
                    continue
                cases = {
                    "prompt": partial(runner.run, prompt_step(p)),
                    "decodes": partial(runner.run, decode_step(d)),
                    "mixed": partial(runner.run, mixed_step(p, d)),
                }
                t = interleaved_medians(cases, repeats)
                ratio, word = verdict(t["mixed"], t["prompt"], t["decodes"])
                lines.append(f"| {backend} | {p} | {d} | {1e3 * t['prompt']:.1f} | {1e3 * t['decodes']:.1f} | "
                             f"{1e3 * t['mixed']:.1f} | {ratio:.2f} | {word} |")
    return lines


def scenario_prompts(long_tokens: int, seed: int = 0) -> dict[str, list[list[int]]]:
    """The three reported scenarios, as token ids (1 = BOS)."""
    rng = random.Random(seed)

    def prompt(n: int) -> list[int]:
        return [1] + [rng.randrange(3, 1900) for _ in range(n - 1)]

    long_prompt = prompt(long_tokens)
    shorts = [prompt(11) for _ in range(7)]  # 77 tokens in all
    return {
        f"one {long_tokens}-token prompt": [long_prompt],
        f"one {long_tokens}-token prompt + 7 short (77 tokens)": [long_prompt, *shorts],
        f"eight {long_tokens}-token prompts": [long_prompt] + [prompt(long_tokens) for _ in range(7)],
    }


def scenario_table(long_tokens: int, repeats: int) -> list[str]:
    prompts = scenario_prompts(long_tokens)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    times = {}
    for backend in BACKENDS:
        llm = LLM(attention_backend=backend, enable_prefix_caching=False, cpu_threads=torch.get_num_threads())
        cases = {name: partial(llm.generate, ps, params, use_tqdm=False) for name, ps in prompts.items()}
        times[backend] = interleaved_medians(cases, repeats)
    lines = ["| scenario | " + " | ".join(f"{b} (s)" for b in BACKENDS) + " | torch_padded / torch |",
             "|---|" + "---:|" * (len(BACKENDS) + 1)]
    for name in prompts:
        cells = " | ".join(f"{times[b][name]:.3f}" for b in BACKENDS)
        lines.append(f"| {name} | {cells} | {times['torch_padded'][name] / times['torch'][name]:.1f}x |")
    return lines


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one small cell, one thread, few repeats (seconds)")
    ap.add_argument("--threads", type=int, nargs="+", default=None, help="torch thread counts (default: 1 2)")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per case (default 7; quick: 2)")
    ap.add_argument("--max-padded-gib", type=float, default=4.0,
                    help="skip torch_padded cells whose attention temporaries would exceed this")
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.decodes, args.long_tokens = [256], [7], 200
        args.threads = args.threads or [1]
        args.repeats = args.repeats or 2
    else:
        args.prompts, args.decodes, args.long_tokens = [256, 1024, 1800], [7, 63], 950
        args.threads = args.threads or [1, 2]
        args.repeats = args.repeats or 7
    if args.repeats < 1 or any(n < 1 for n in args.threads):
        ap.error(f"--repeats and --threads must be >= 1, got {args.repeats} and {args.threads}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    print("$ python benchmarks/mixed_steps.py " + shlex.join(argv))
    print(f"decode contexts {DECODE_CONTEXT[0]}-{DECODE_CONTEXT[1]} tokens, block size {BLOCK_SIZE}, "
          f"median of {args.repeats} runs; pass: mixed <= {MAX_RATIO} x (prompt alone + decodes alone)")
    for threads in args.threads:
        torch.set_num_threads(threads)
        print(f"\n### torch threads: {threads}\n")
        print("One forward step of the tiny model:\n")
        print("\n".join(mixed_table(args.prompts, args.decodes, args.repeats, args.max_padded_gib)), flush=True)
        print("\nPrefill through LLM.generate (max_tokens=1, no prefix caching):\n")
        print("\n".join(scenario_table(args.long_tokens, args.repeats)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
