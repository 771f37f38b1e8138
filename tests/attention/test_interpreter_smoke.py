"""Does Triton run correctly *here*? Cheap checks for the ways a CPU setup silently goes wrong.

See docs/triton_kernels.md, "Interpreter pitfalls", for what each check guards against. On a
CUDA machine the interpreter checks are skipped and the kernel checks run compiled.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

import minivllm
from minivllm.attention import triton_cache, triton_decode, triton_prefill
from minivllm.attention.triton_decode import dot_settings

NO_CUDA = not torch.cuda.is_available()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _axpy_kernel(x_ptr, y_ptr, out_ptr, n, a, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    # Upcast first: arithmetic must never run on bf16 in the interpreter (see the docs).
    x = tl.load(x_ptr + i, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + i, mask=mask).to(tl.float32)
    tl.store(out_ptr + i, a * x + y, mask=mask)


@triton.jit
def _loop_sum_kernel(bounds_ptr, x_ptr, out_ptr):
    # Loop bounds read from memory at run time, as the attention kernels' block loops are.
    start = tl.load(bounds_ptr)
    end = tl.load(bounds_ptr + 1)
    total = tl.zeros([1], dtype=tl.float32)
    for i in range(start, end):
        total += tl.load(x_ptr + i + tl.arange(0, 1))
    tl.store(out_ptr + tl.arange(0, 1), total)


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, UPCAST: tl.constexpr):
    m, n, k = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + m[:, None] * K + k[None, :])
    b = tl.load(b_ptr + k[:, None] * N + n[None, :])
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    tl.store(c_ptr + m[:, None] * N + n[None, :], tl.dot(a, b, input_precision="ieee"))


@pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is present: kernels run compiled")
def test_interpreter_is_on_without_cuda():
    assert os.environ.get("TRITON_INTERPRET") == "1"
    assert minivllm.TRITON_MODE == "interpreted"


@pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is present: kernels run compiled")
def test_fresh_process_switches_interpreter_on():
    """Importing minivllm's attention package (which every engine import does, before any
    kernel is defined) must set the flag, in a process that never set it."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import os, minivllm.attention, minivllm; "
        "print(os.environ.get('TRITON_INTERPRET'), minivllm.TRITON_MODE)"
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "interpreted"]


IMPORT_FIRST = {
    "triton": "import triton",
    "torch._inductor": "import torch._inductor",
}

ENGINE_AFTER = """
from minivllm import LLM, SamplingParams
params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
tokens = {}
for backend in ("torch", "triton"):
    llm = LLM(attention_backend=backend, max_model_len=64, num_kv_blocks=8, block_size=16)
    tokens[backend] = llm.generate([[1, 5, 6, 7]], params, use_tqdm=False)[0].outputs[0].token_ids
assert tokens["triton"] == tokens["torch"], tokens
print("ok", tokens["triton"])
"""


@pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is present: kernels run compiled")
@pytest.mark.parametrize("first", list(IMPORT_FIRST))
def test_triton_imported_before_minivllm(first):
    """Triton's library functions (``tl.zeros``, ``tl.sum``, ...) are ``@triton.jit`` functions
    defined when ``triton`` is imported. Imported before ``minivllm`` sets the flag, they were
    compiled ones, and the first interpreted kernel that called one failed with
    ``InterpreterError: Cannot call @triton.jit'd outside of the scope of a kernel``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = IMPORT_FIRST[first] + "\n" + ENGINE_AFTER
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("ok")


def test_compiled_library_function_is_refused_with_advice(monkeypatch):
    """If a compiled Triton function is still reachable with the interpreter on, creating the
    backend says what happened and what to do, instead of failing inside the first step."""
    from triton.runtime.jit import JITFunction

    from minivllm.attention import get_attention_backend

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("kernels run compiled here")
    monkeypatch.setattr(tl, "zeros", JITFunction(tl.zeros.fn))
    with pytest.raises(RuntimeError, match="import minivllm` first"):
        get_attention_backend("triton")


def test_our_kernels_were_defined_in_the_right_mode():
    """The flag is read when ``@triton.jit`` runs. A kernel defined before it was set stays a
    compiled JITFunction, which on a machine without a GPU fails at launch."""
    from triton.runtime.interpreter import InterpretedFunction

    kernels = [
        triton_cache._reshape_and_cache_kernel,
        triton_decode._paged_decode_kernel,
        triton_decode._merge_splits_kernel,
        triton_decode.online_softmax_step,
        triton_prefill._paged_prefill_kernel,
    ]
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    for kernel in kernels:
        assert isinstance(kernel, InterpretedFunction) == interpreted, kernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=lambda d: str(d)[6:])
def test_tiny_kernel_is_exact_and_nonzero(dtype):
    """Small integers are exact in every dtype, so the result must match bit for bit."""
    n = 300  # not a multiple of the block: the last program is masked
    x = torch.arange(n, device=DEVICE).remainder(17).to(dtype)
    y = torch.arange(n, device=DEVICE).remainder(5).to(dtype) + 1
    out = torch.zeros(n, device=DEVICE)
    _axpy_kernel[(triton.cdiv(n, 128),)](x, y, out, n, 3.0, BLOCK=128)
    expected = 3.0 * x.float() + y.float()
    assert out.abs().sum() > 0, "all-zero output: the kernel did not run or wrote elsewhere"
    assert torch.equal(out, expected)


def test_runtime_loop_bounds():
    """``range(start, end)`` over values loaded in the kernel. Interpreters of older Triton
    releases crash here with NumPy >= 2.4 (a 1-element array no longer converts to int)."""
    x = torch.arange(10, dtype=torch.float32, device=DEVICE)
    out = torch.zeros(1, device=DEVICE)
    _loop_sum_kernel[(1,)](torch.tensor([2, 7], dtype=torch.int32, device=DEVICE), x, out)
    assert out.item() == 2 + 3 + 4 + 5 + 6


def test_bf16_dot_through_our_upcast_is_exact():
    """The kernels' bf16 path (``dot_settings``) must give the exact product of bf16 inputs."""
    upcast, _ = dot_settings(torch.bfloat16)
    assert upcast == (os.environ.get("TRITON_INTERPRET") == "1")
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(-4, 5, (16, 32), generator=gen).to(torch.bfloat16).to(DEVICE)
    b = torch.randint(-4, 5, (32, 16), generator=gen).to(torch.bfloat16).to(DEVICE)
    c = torch.zeros(16, 16, device=DEVICE)
    _dot_kernel[(1,)](a, b, c, M=16, N=16, K=32, UPCAST=upcast)
    assert torch.equal(c, a.float() @ b.float())
