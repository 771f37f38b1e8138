"""Grade exercise 06 (`pytest -m ex06`): beyond the notebook's cases (`test_cases.py`),
random batches against the shared float64 reference (`minivllm.attention.testing`), other
dtypes, the backend the engine uses, and a compile for real GPUs.

Imports `exercises/ex06_triton_kernel.py` (your work) by default, `solutions/` with
`MINIVLLM_SOLUTIONS=1` or `--solutions`. Run as a script (with `TRITON_INTERPRET=0`) it compiles
the kernel for NVIDIA GPUs instead; `test_kernel_compiles_for_nvidia_gpus` does that.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from minivllm import course
from minivllm.attention.testing import DEFAULT_DEVICE as DEVICE
from minivllm.attention.testing import assert_matches_reference, decode_problem

NAME = "ex06_triton_kernel"
KERNELS_DIR = Path(__file__).resolve().parents[1] / "attention"
sys.path.insert(0, str(KERNELS_DIR))  # gpu_compile_check, also when run as a script


def run(ex, problem):
    k_cache, v_cache = problem.caches(after=True)
    return ex.paged_decode(problem.query, k_cache, v_cache, problem.block_tables, problem.seq_lens, problem.scale)


# --- random batches against float64 SDPA on contiguous tensors (minivllm.attention.testing) ------
@st.composite
def decode_batches(draw):
    num_kv_heads = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 3, 4]))
    block_size = draw(st.sampled_from([16, 32]))
    seq_lens = draw(st.lists(st.integers(1, 3 * block_size + 1), min_size=1, max_size=4))
    shared = draw(st.integers(0, 2))  # leading blocks every sequence shares with the first
    return dict(seq_lens=seq_lens, num_heads=group * num_kv_heads, num_kv_heads=num_kv_heads,
                block_size=block_size, share={i: (0, shared) for i in range(1, len(seq_lens))},
                seed=draw(st.integers(0, 10_000)))


# No shrinking: every example costs interpreter time, and the failing batch is printed anyway.
@settings(max_examples=12, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(decode_batches())
def test_random_batches_match_reference(ex, spec):
    problem = decode_problem(spec.pop("seq_lens"), head_dim=32, dtype=torch.float32, **spec)
    assert_matches_reference(run(ex, problem), problem)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision_caches(ex, dtype):
    """The arithmetic is fp32 whatever the cache holds; only the output is rounded."""
    problem = decode_problem([1, 16, 45], num_heads=6, num_kv_heads=2, head_dim=32, block_size=16,
                             dtype=dtype, seed=3)
    assert_matches_reference(run(ex, problem), problem)


# --- the backend the engine calls ----------------------------------------------------------------
def backend_step(backend, query_lens, seq_lens, tables, seed=0):
    """One engine-like step through ``backend``: writes K/V, returns (output, k_cache, v_cache)."""
    from minivllm.attention.metadata import AttentionMetadata

    gen = torch.Generator().manual_seed(seed)
    block_size, num_blocks, heads, kv_heads, dim = 16, 12, 6, 2, 32
    slots = []
    for n_new, n, table in zip(query_lens, seq_lens, tables, strict=True):
        slots += [table[p // block_size] * block_size + p % block_size for p in range(n - n_new, n)]
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, slots, block_size, device=DEVICE)
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen).to(DEVICE)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen).to(DEVICE)
    tokens = sum(query_lens)
    q, k, v = (
        torch.randn(tokens, h, dim, generator=gen).to(DEVICE) for h in (heads, kv_heads, kv_heads)
    )
    out = backend.forward(q, k, v, k_cache, v_cache, meta, dim**-0.5)
    return out, k_cache, v_cache


@pytest.mark.parametrize(
    "query_lens, seq_lens, tables",
    [
        ([1, 1, 1], [17, 33, 16], [[4, 7], [4, 7, 2], [9]]),  # decode only; 0 and 1 share blocks
        ([1, 5, 1], [17, 21, 3], [[4, 7], [4, 2], [9]]),  # a prompt chunk among decodes
    ],
    ids=["decode-only", "mixed"],
)
def test_backend_matches_minivllm_reference_backend(ex, query_lens, seq_lens, tables):
    from minivllm.attention import get_attention_backend

    backend = ex.PagedDecodeBackend()
    got = backend_step(backend, query_lens, seq_lens, tables)
    want = backend_step(get_attention_backend("torch"), query_lens, seq_lens, tables)
    for g, w, what in zip(got, want, ["output", "k_cache", "v_cache"], strict=True):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=2e-5, msg=lambda m, what=what: f"{what}: {m}")
    decode_only = max(query_lens) == 1
    assert (backend.kernel_calls, backend.reference_calls) == ((1, 0) if decode_only else (0, 1))


def test_bad_inputs_are_refused(ex):
    problem = decode_problem([20], num_heads=6, num_kv_heads=2, head_dim=32, block_size=16, dtype=torch.float32)
    (kc, vc), q, bt, sl = problem.caches(after=True), problem.query, problem.block_tables, problem.seq_lens
    with pytest.raises(ValueError, match="block_size .* got 8"):
        ex.paged_decode(q, kc[:, :8], vc[:, :8], bt, sl, 0.1)
    with pytest.raises(ValueError, match="num_heads=5 is not a multiple of num_kv_heads=2"):
        ex.paged_decode(q[:, :5], kc, vc, bt, sl, 0.1)
    with pytest.raises(ValueError, match="share a dtype"):
        ex.paged_decode(q.half(), kc, vc, bt, sl, 0.1)
    with pytest.raises(ValueError, match="seq_lens"):
        ex.paged_decode(q, kc, vc, bt, sl.repeat(2), 0.1)


# --- compiled for real GPUs, on a machine without one -------------------------------------------
COMPILE_CASES = [  # (cache dtype, head_dim, group, block_size, compute capability)
    ("fp32", 32, 3, 16, 75),  # the tiny model on a T4
    ("bf16", 128, 4, 16, 90),  # Llama-3-8B on an H100
    ("fp16", 80, 5, 32, 80),  # odd head_dim and group on an A100
]


# the ladder's kernels, compiled once each for sm_80: fp32, head_dim 40 (tile 64), 3 heads per KV head
LADDER = ("load_block_kernel", "attend_whole_kernel", "attend_blocks_kernel", "split_kernel", "merge_kernel")


def test_kernel_compiles_for_nvidia_gpus():
    """The interpreter accepts code a GPU compiler rejects; compile the kernels for sm_75/80/90
    (Triton ships ptxas, no GPU needed) in a process where kernels are not interpreted."""
    pytest.importorskip("triton.backends.nvidia")
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    result = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(records) == len(COMPILE_CASES) + len(LADDER)
    errors = [f"{r['case']}: {r['error']}" for r in records if "error" in r]
    assert not errors, "\n".join(errors)


def compile_for_gpus() -> int:
    import triton
    from gpu_compile_check import _signature
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = course.load(NAME).paged_decode_kernel
    for dtype, head_dim, group, block_size, capability in COMPILE_CASES:
        args = {name: 64 for name in kernel.arg_names if name.startswith("stride_")}
        args.update(
            out_ptr=f"*{dtype}", q_ptr=f"*{dtype}", k_cache_ptr=f"*{dtype}", v_cache_ptr=f"*{dtype}",
            block_tables_ptr="*i32", seq_lens_ptr="*i32", scale=0.1, GROUP=("c", group),
            GROUP_PAD=("c", max(16, triton.next_power_of_2(group))), HEAD_DIM=("c", head_dim),
            BLOCK_D=("c", max(16, triton.next_power_of_2(head_dim))), BLOCK_SIZE=("c", block_size),
        )
        record: dict = {"case": [dtype, head_dim, group, block_size, capability]}
        try:
            signature, constants = _signature(kernel, args)
            target = GPUTarget("cuda", capability, 32)
            triton.compile(ASTSource(kernel, signature, constants), target=target)
        except Exception as exc:  # reported to the test, which fails on it
            record["error"] = f"{type(exc).__name__}: {str(exc)[:800]}"
        print(json.dumps(record), flush=True)
    ex = course.load(NAME)
    for name in LADDER:
        kernel = getattr(ex, name)
        args = {arg: 64 for arg in kernel.arg_names if arg.startswith("stride_")}
        args.update({arg: "*fp32" for arg in kernel.arg_names if arg.endswith("_ptr")})
        args.update(block_tables_ptr="*i32", seq_lens_ptr="*i32", scale=0.1, blocks_per_split=4, num_splits=4,
                    GROUP=("c", 3), HEAD_DIM=("c", 40), BLOCK_D=("c", 64), BLOCK_SIZE=("c", 16),
                    SEQ_PAD=("c", 128), SPLITS_PAD=("c", 4))
        record = {"case": [name, "fp32", 40, 3, 16, 80]}
        try:
            signature, constants = _signature(kernel, {arg: args[arg] for arg in kernel.arg_names})
            triton.compile(ASTSource(kernel, signature, constants), target=GPUTarget("cuda", 80, 32))
        except Exception as exc:  # reported to the test, which fails on it
            record["error"] = f"{type(exc).__name__}: {str(exc)[:800]}"
        print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("run with TRITON_INTERPRET=0: interpreted kernels cannot be compiled")
    sys.exit(compile_for_gpus())
