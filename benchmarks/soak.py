"""Soak test: many requests, some bad, random aborts and closed streams, a pool that preempts.

Every good request must finish with exactly the tokens it gets on an engine with a pool large
enough never to preempt; every bad request must be refused at the door or end with an error;
aborted requests end with ``finish_reason="abort"``; afterwards no KV block and no per-request
entry remains. Greedy and seeded sampling only, so that tokens are comparable run to run.

The bad requests cover the whole range of each field's type (NaN, ``2**63``, values past the
vocabulary, 65 stop strings, lone surrogates...), requests whose rows the "model" poisons with
NaN, and requests whose sampling raises (a fault only their row causes). "edge" requests use the
largest and smallest values the checks allow (a 1e-40 temperature, ``top_k`` = the vocabulary,
the largest seed, 64 stop strings) and count as good: their tokens are compared too.

    python benchmarks/soak.py [--requests 1000] [--seed 0] [--policy fcfs|priority|both]

The suite runs a small version (``tests/benchmarks/test_soak.py``).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass

from minivllm import LLM, SamplingParams
from minivllm.engine.core_client import local_core
from minivllm.sample.sampler import Sampler
from minivllm.sampling_params import MAX_N, MAX_STOP_STRINGS

WORDS = "the fox ran to a big old tree and saw one little bird who sang all day".split()


@dataclass
class Item:
    rid: str
    prompt: list[int] | str
    params: SamplingParams | dict  # a dict: arguments that SamplingParams must refuse
    priority: int
    kind: str  # "good", "edge", "bad_params", "bad_prompt", "poisoned", "faulty", "abort", "stream"


def make_plan(n: int, seed: int, vocab: int) -> list[Item]:
    rng = random.Random(seed)
    shared = [rng.randrange(8, vocab) for _ in range(rng.randint(20, 40))]
    items = []
    for i in range(n):
        prompt = [rng.randrange(8, vocab) for _ in range(rng.randint(1, 24))]
        if rng.random() < 0.3:
            prompt = shared + prompt  # prefix-cache hits
        sampled = rng.random() < 0.5
        params = SamplingParams(
            n=rng.choice([1, 1, 1, 2]), max_tokens=rng.randint(1, 16), ignore_eos=rng.random() < 0.5,
            temperature=rng.choice([0.7, 1.0, 1.3]) if sampled else 0.0,
            top_k=rng.choice([0, 5, 50]), top_p=rng.choice([1.0, 0.9]),
            seed=rng.randrange(2**32) if sampled else None,
            stop=[rng.choice(WORDS)] if rng.random() < 0.2 else None,
        )
        kind = rng.choices(["good", "edge", "bad_params", "bad_prompt", "poisoned", "faulty", "abort", "stream"],
                           weights=[74, 4, 5, 3, 2, 2, 7, 3])[0]
        if kind == "edge":
            params = SamplingParams(**{**params.__dict__, **rng.choice(edge_params(vocab))})
        if kind == "bad_params":
            params = rng.choice(bad_params(vocab))
        if kind == "bad_prompt":
            prompt = rng.choice([[vocab + 5], [], list(range(8, 8 + 10_000))])
        items.append(Item(f"r{i}", prompt, params, rng.randrange(3), kind))
    return items


def bad_params(vocab: int) -> list[dict]:
    """Arguments that ``SamplingParams`` or the engine must refuse: each one once passed the
    door and failed every request of its step, or would have."""
    return [
        {"temperature": float("nan")}, {"seed": "abc"}, {"seed": 2**70}, {"max_tokens": 1.5}, {"top_p": 0.0},
        {"top_k": 2**63, "temperature": 1.0}, {"top_k": vocab + 1, "temperature": 1.0},
        {"logprobs": vocab + 5}, {"prompt_logprobs": vocab + 5}, {"logprobs": 2**63},
        {"temperature": 1e39}, {"n": MAX_N + 1}, {"stop": ["x"] * (MAX_STOP_STRINGS + 1)},
        {"stop": ["a\ud800"]}, {"stop_token_ids": [vocab]}, {"stop_token_ids": [3] * (vocab + 1)},
        {"min_tokens": 1, "stop_token_ids": list(range(vocab))},
    ]


def edge_params(vocab: int) -> list[dict]:
    """The extremes the checks accept, served like any request."""
    return [
        {"temperature": 1e-40}, {"temperature": 5e-324, "seed": 2**64 - 1},
        {"top_k": vocab, "temperature": 0.8, "seed": 2**64 - 1}, {"top_p": 5e-324, "temperature": 1.0, "seed": 1},
        {"stop": [f"never{i}" for i in range(MAX_STOP_STRINGS)]}, {"logprobs": vocab}, {"prompt_logprobs": 50},
    ]


class PoisonRows(Sampler):
    """NaN logits for the poisoned requests' rows (a numerically broken model, for them only),
    and an exception whenever a faulty request's row is sampled (a fault only that row causes:
    the model runner must attribute it to that row and spare the others)."""

    def __init__(self, inner: Sampler, poisoned: set[tuple[int, ...]], faulty: set[tuple[int, ...]]):
        super().__init__()
        self.inner, self.poisoned, self.faulty = inner, poisoned, faulty

    def __call__(self, logits, requests):
        for i, r in enumerate(requests):
            if tuple(r.prompt_token_ids) in self.faulty:
                raise RuntimeError("simulated sampling fault")
            if tuple(r.prompt_token_ids) in self.poisoned:
                logits[i, 0] = float("nan")
        return self.inner(logits, requests)


def per_request_entries(llm: LLM) -> int:
    e = llm.engine
    return (len(e.output_processor.families) + len(e.output_processor.children)
            + len(local_core(e).request_ids())
            + len(llm._inboxes))


def serve(llm: LLM, plan: list[Item], seed: int) -> tuple[dict[str, list], dict[str, int]]:
    """Run the plan on the engine; return each finished request's ``(finish_reason, token ids)``
    per sample and the outcome counts. "abort" items are aborted 0-3 steps after they arrive;
    "stream" items are abandoned after their first token, as a closed stream is."""
    rng = random.Random(seed + 1)
    engine = llm.engine
    poisoned = {tuple(it.prompt) for it in plan if it.kind == "poisoned"}
    faulty = {tuple(it.prompt) for it in plan if it.kind == "faulty"}
    local_core(engine).executor.sampler = PoisonRows(local_core(engine).executor.sampler, poisoned, faulty)
    # abandoned: of the aborted; bad_accepted: bad requests that got past the door (must be 0)
    counts = dict(refused=0, bad_accepted=0, finished=0, aborted=0, failed=0, abandoned=0)
    results: dict[str, list] = {}
    abort_at: dict[str, int] = {}  # request id -> step at which to abort it
    step = 0

    def run_step() -> None:
        nonlocal step
        for out in engine.step():
            if out.finished:
                record(out, results, counts)
            elif out.request_id in abort_at and abort_at[out.request_id] < 0:  # a "stream": 1st token
                abort_at[out.request_id] = step
        due = [rid for rid, at in abort_at.items() if 0 <= at <= step and rid not in results]
        for out in engine.abort_request(due):
            record(out, results, counts)
        step += 1

    for it in plan:
        try:
            params = it.params if isinstance(it.params, SamplingParams) else SamplingParams(**it.params)
            engine.add_request(it.rid, it.prompt, params, priority=it.priority)
        except (ValueError, TypeError):
            counts["refused"] += 1
            continue
        counts["bad_accepted"] += it.kind in ("bad_params", "bad_prompt")
        if it.kind == "abort":
            abort_at[it.rid] = step + rng.randint(0, 3)
        elif it.kind == "stream":
            abort_at[it.rid] = -1
        if rng.random() < 0.3:  # let the engine run a little between arrivals
            run_step()
    while engine.has_unfinished_requests():
        run_step()
    streams = {it.rid for it in plan if it.kind == "stream"}
    counts["abandoned"] = sum(1 for rid in streams if results.get(rid, [("", [])])[0][0] == "abort")
    local_core(engine).executor.sampler = local_core(engine).executor.sampler.inner
    return results, counts


def close_streams_midway(llm: LLM, plan: list[Item], num: int) -> None:
    """``LLM.stream`` calls broken off after two outputs, next to a ``generate`` call."""
    good = [it for it in plan if it.kind == "good"][:num]
    streams = [llm.stream([it.prompt], it.params) for it in good]
    for s in streams:
        next(s, None)
    llm.generate([it.prompt for it in good], [it.params for it in good], use_tqdm=False)
    for s in streams:
        next(s, None)
        s.close()


def record(out, results, counts) -> None:
    reasons = {c.finish_reason for c in out.outputs}
    results[out.request_id] = [(c.finish_reason, c.token_ids) for c in out.outputs]
    if "error" in reasons:
        counts["failed"] += 1
    elif "abort" in reasons:
        counts["aborted"] += 1
    else:
        counts["finished"] += 1


def soak(num_requests: int, seed: int, policy: str, verbose: bool = True) -> dict[str, int]:
    common = dict(max_model_len=128, scheduling_policy=policy, max_num_batched_tokens=96)
    small = LLM(num_kv_blocks=24, enable_prefix_caching=True, **common)
    plan = make_plan(num_requests, seed, small.engine.model_config.vocab_size)
    t0 = time.perf_counter()
    results, counts = serve(small, plan, seed)
    close_streams_midway(small, plan, 5)
    elapsed = time.perf_counter() - t0
    # the same good requests, alone on a pool that never preempts
    big = LLM(num_kv_blocks=4096, enable_prefix_caching=False, **common)
    good = [it for it in plan if it.kind in ("good", "edge")]
    want = big.generate([it.prompt for it in good], [it.params for it in good], use_tqdm=False)
    mismatched = [it.rid for it, w in zip(good, want, strict=True)
                  if [t for _, t in results.get(it.rid, [])] != [c.token_ids for c in w.outputs]]
    poisoned_ok = all(results[it.rid][0][0] == "error" for it in plan if it.kind in ("poisoned", "faulty"))
    stats = small.stats().summary()
    report = dict(
        requests=num_requests, good=len(good), mismatched=len(mismatched), **counts,
        preemptions=stats["preemptions"], prefix_hit_tokens=stats["prefix_cache_hits"],
        kv_blocks_left=local_core(small).kv.num_used_blocks, entries_left=per_request_entries(small),
        poisoned_failed=int(poisoned_ok),
    )
    if verbose:
        print(f"policy={policy}: {num_requests} requests in {elapsed:.1f} s")
        for k, v in report.items():
            print(f"  {k:>18}: {v}")
        if mismatched:
            print(f"  first mismatches: {mismatched[:5]}")
    small.engine.check_invariants()
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policy", choices=["fcfs", "priority", "both"], default="both")
    args = ap.parse_args(argv)
    print(f"$ python benchmarks/soak.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    ok = True
    for policy in ("fcfs", "priority") if args.policy == "both" else (args.policy,):
        r = soak(args.requests, args.seed, policy)
        ok &= r["mismatched"] == 0 and r["kv_blocks_left"] == 0 and r["entries_left"] == 0 and not r["bad_accepted"]
        ok &= bool(r["poisoned_failed"]) and r["preemptions"] > 0
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
