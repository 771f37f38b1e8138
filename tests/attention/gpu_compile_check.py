"""Compile the kernels for real NVIDIA GPUs on a machine that has none (no launch, no driver).

The interpreter accepts code that a GPU compiler rejects (``tl.dot`` tiles under 16 rows, for
example) and knows nothing of shared-memory limits. Triton can lower a kernel all the way to a
cubin (``ptxas`` ships with the wheel) for any ``GPUTarget`` without a device, which is what this
script does, and it reads each kernel's registers per thread and spilled bytes from
``ptxas -v``. It must run in a process where ``TRITON_INTERPRET=0``, so that ``@triton.jit``
builds compilable kernels; ``test_gpu_compile.py`` starts it that way and reads its JSON.

    TRITON_INTERPRET=0 python tests/attention/gpu_compile_check.py   # prints one JSON object per case
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path


def _signature(fn, args: dict) -> tuple[dict, dict]:
    """``args`` values: "*fp16"-style pointer types, ints (i32), floats (fp32), or
    ``("c", value)`` for constexprs. Returns ``(signature, constexprs)`` for ``ASTSource``."""
    sig, consts = {}, {}
    for name in fn.arg_names:
        value = args[name]
        if isinstance(value, tuple):
            sig[name], consts[name] = "constexpr", value[1]
        elif isinstance(value, str):
            sig[name] = value
        elif isinstance(value, int):
            sig[name] = "i32"
        else:
            sig[name] = "fp32"
    return sig, consts


def _strides(prefix: str, names) -> dict:
    return {f"stride_{prefix}{n}": 64 for n in names}


def decode_args(dtype: str, head_dim: int, group: int, block_size: int, split: bool, int8: bool = False) -> dict:
    import triton

    kv = "i8" if int8 else dtype  # an 8-bit cache: rows of head_dim codes + a float32 scale
    return dict(
        out_ptr="*fp32" if split else f"*{dtype}", lse_ptr="*fp32", q_ptr=f"*{dtype}", k_cache_ptr=f"*{kv}",
        v_cache_ptr=f"*{kv}", block_tables_ptr="*i32", seq_lens_ptr="*i32", scale=0.1, num_splits=4,
        **_strides("q", "shd"), **_strides("k", "bthd"), **_strides("v", "bthd"), stride_bts=64,
        **_strides("o", ["s", "h", "split", "d"]), stride_ls=64, stride_lh=64,
        GROUP=("c", group), GROUP_PAD=("c", max(16, triton.next_power_of_2(group))), HEAD_DIM=("c", head_dim),
        BLOCK_D=("c", triton.next_power_of_2(head_dim)), BLOCK_SIZE=("c", block_size), IS_SPLIT=("c", split),
        UPCAST=("c", False), DOT_PRECISION=("c", "ieee" if dtype == "fp32" else "tf32"), KV_INT8=("c", int8),
    )


def prefill_args(dtype: str, head_dim: int, group: int, block_size: int, int8: bool = False) -> dict:
    import triton

    from minivllm.attention.triton_prefill import BLOCK_M_TARGET

    group_pad = triton.next_power_of_2(group)
    kv = "i8" if int8 else dtype
    return dict(
        out_ptr=f"*{dtype}", q_ptr=f"*{dtype}", k_cache_ptr=f"*{kv}", v_cache_ptr=f"*{kv}",
        block_tables_ptr="*i32", query_start_loc_ptr="*i32", seq_lens_ptr="*i32", readable_lens_ptr="*i32",
        scale=0.1,
        **_strides("q", "thd"), **_strides("k", "bthd"), **_strides("v", "bthd"), stride_bts=64,
        **_strides("o", "thd"),
        GROUP=("c", group), GROUP_PAD=("c", group_pad), BLOCK_Q=("c", max(1, BLOCK_M_TARGET // group_pad)),
        HEAD_DIM=("c", head_dim), BLOCK_D=("c", triton.next_power_of_2(head_dim)), BLOCK_SIZE=("c", block_size),
        UPCAST=("c", False), DOT_PRECISION=("c", "ieee" if dtype == "fp32" else "tf32"), KV_INT8=("c", int8),
    )


def merge_args(dtype: str) -> dict:
    return dict(
        out_ptr=f"*{dtype}", partial_ptr="*fp32", lse_ptr="*fp32", num_splits=5, **_strides("o", "shd"),
        **_strides("p", ["s", "h", "split", "d"]), stride_ls=64, stride_lh=64,
        HEAD_DIM=("c", 80), BLOCK_D=("c", 128), BLOCK_SPLITS=("c", 8),
    )


def cache_args(dtype: str) -> dict:
    return dict(
        key_ptr=f"*{dtype}", value_ptr=f"*{dtype}", k_cache_ptr=f"*{dtype}", v_cache_ptr=f"*{dtype}",
        slot_mapping_ptr="*i64", **_strides("k", "thd"), **_strides("v", "thd"),
        **_strides("kc", "bshd"), **_strides("vc", "bshd"),
        NUM_KV_HEADS=("c", 3), HEAD_DIM=("c", 80), BLOCK_SIZE=("c", 16), BLOCK_H=("c", 4), BLOCK_D=("c", 128),
    )


def cache_int8_args(dtype: str) -> dict:
    return dict(
        key_ptr=f"*{dtype}", value_ptr=f"*{dtype}", k_cache_ptr="*i8", v_cache_ptr="*i8",
        slot_mapping_ptr="*i64", **_strides("k", "thd"), **_strides("v", "thd"),
        **_strides("kc", "bsh"), **_strides("vc", "bsh"),
        NUM_KV_HEADS=("c", 3), HEAD_DIM=("c", 80), BLOCK_SIZE=("c", 16), BLOCK_H=("c", 4), BLOCK_D=("c", 128),
    )


# (kernel, arguments, compute capability): the default configuration (block 16, head_dim 128)
# in the dtypes each card runs, plus odd shapes (head_dim 80, 5:1 GQA, block 32).
CASES = [
    ("decode", ("bf16", 128, 4, 16, False), 90),
    ("decode", ("bf16", 128, 4, 16, True), 90),
    ("decode", ("fp16", 80, 5, 32, False), 80),
    ("decode", ("fp16", 128, 8, 16, False), 75),
    ("prefill", ("bf16", 128, 4, 16), 90),
    ("prefill", ("fp16", 80, 5, 32), 80),
    ("prefill", ("fp16", 128, 1, 16), 75),
    ("prefill", ("fp32", 64, 2, 16), 75),
    ("merge", ("bf16",), 90),
    ("cache", ("fp16",), 75),
    # the 8-bit KV cache (kv_cache_dtype="int8"): int8 codes + float32 scale per row
    ("decode", ("bf16", 128, 4, 16, False, True), 90),
    ("decode", ("bf16", 128, 4, 16, True, True), 90),
    ("decode", ("fp16", 128, 8, 16, False, True), 75),
    ("prefill", ("bf16", 128, 4, 16, True), 90),
    ("prefill", ("fp16", 80, 5, 32, True), 80),
    ("prefill", ("fp16", 128, 1, 16, True), 75),
    ("cache_int8", ("bf16",), 90),
    ("cache_int8", ("fp16",), 75),
]


PTXAS_USAGE = re.compile(r"Used (\d+) registers")
PTXAS_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def ptxas_usage(ptx: str, capability: int) -> dict:
    """``ptxas -v`` (Triton's own, with the flags Triton passes it) on the kernel's PTX:
    ``{"registers": per thread, "spill_bytes": spill stores + loads}``."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    ptxas = get_ptxas(capability).path
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        done = subprocess.run([ptxas, "-v", "--regAllocOptLevel=2", f"--gpu-name={sm_arch_from_capability(capability)}",
                               str(src), "-o", str(src.with_suffix(".o"))], capture_output=True, text=True, check=True)
    log = done.stdout + done.stderr
    registers = [int(n) for n in PTXAS_USAGE.findall(log)]
    spills = [int(a) + int(b) for a, b in PTXAS_SPILLS.findall(log)]
    if not registers:
        raise RuntimeError(f"no register count in ptxas -v's output: {log[-500:]}")
    return {"registers": max(registers), "spill_bytes": sum(spills)}


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("run with TRITON_INTERPRET=0: interpreted kernels cannot be compiled", file=sys.stderr)
        return 2
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from minivllm.attention import triton_cache, triton_decode, triton_prefill

    kernels = {
        "decode": (triton_decode._paged_decode_kernel, decode_args),
        "prefill": (triton_prefill._paged_prefill_kernel, prefill_args),
        "merge": (triton_decode._merge_splits_kernel, merge_args),
        "cache": (triton_cache._reshape_and_cache_kernel, cache_args),
        "cache_int8": (triton_cache._reshape_and_cache_int8_kernel, cache_int8_args),
    }
    for name, params, capability in CASES:
        fn, make_args = kernels[name]
        sig, consts = _signature(fn, make_args(*params))
        record = {"kernel": name, "params": list(params), "capability": capability}
        options = {"num_warps": triton_prefill.NUM_WARPS} if name == "prefill" else {}  # as launched
        try:
            compiled = triton.compile(ASTSource(fn, sig, consts), target=GPUTarget("cuda", capability, 32),
                                      options=options)
            record["shared_bytes"] = int(compiled.metadata.shared)
            record.update(ptxas_usage(compiled.asm["ptx"], capability))
        except Exception as exc:  # reported to the test, which fails on it
            record["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
