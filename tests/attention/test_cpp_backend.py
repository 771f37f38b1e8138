"""The ``"cpp"`` backend: the C++ kernel that reads the paged cache in place, against float64.

The shared contract (every step shape, NaN and inf in unowned slots, block sizes, greedy tokens
against transformers) runs it beside the other backends in ``test_backends_vs_sdpa.py`` and
``test_attention_backends.py``. Here: what only this backend has -- one kernel call for every
short sequence whatever its number of new tokens, the head sizes compiled in and the generic
one, every cache format (float32, float16, bfloat16, int8), the refusals, and the fallback when
the kernel cannot be built.
"""

from __future__ import annotations

import pytest
import torch

from minivllm import attention
from minivllm.attention import cpp_backend, get_attention_backend
from minivllm.attention.testing import (
    Seq,
    assert_matches_reference,
    int8_problem,
    make_paged_problem,
)

pytestmark = pytest.mark.skipif(cpp_backend.kernel_status() is not None,
                                reason=f"the C++ kernel does not build here: {cpp_backend.kernel_status()}")

# decodes, drafts being verified (2..16 new tokens over a context), a prompt, a chunk, a
# sequence shorter than a block, one that ends exactly on a block boundary
STEP = [Seq(new=1, context=40), Seq(new=1, context=0), Seq(new=5, context=33), Seq(new=16, context=70),
        Seq(new=23), Seq(new=17, context=32), Seq(new=1, context=3), Seq(new=1, context=47)]


def run(problem):
    k_cache, v_cache = problem.caches()
    backend = get_attention_backend("cpp")
    return backend.forward(problem.query, problem.key, problem.value, k_cache, v_cache, problem.meta, problem.scale)


@pytest.mark.parametrize("head_dim", [32, 64, 128, 80, 4], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_matches_float64_for_compiled_and_generic_head_sizes(head_dim, block_size):
    """32, 64, 128 have loops compiled for their size; 80 and 4 take the generic path."""
    problem = make_paged_problem(STEP, num_heads=6, num_kv_heads=2, head_dim=head_dim, block_size=block_size,
                                 dtype=torch.float32, share={7: (0, 40 // block_size)}, guard_blocks=1, seed=1)
    assert_matches_reference(run(problem), problem)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_caches_and_queries(dtype):
    problem = make_paged_problem(STEP, head_dim=64, dtype=dtype, seed=2)
    out = run(problem)
    assert out.dtype == dtype
    assert_matches_reference(out, problem)


@pytest.mark.parametrize("unowned_scale", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_int8_cache_matches_float64_on_the_dequantised_cache(unowned_scale):
    problem = int8_problem(make_paged_problem(STEP, head_dim=32, dtype=torch.float32, seed=3),
                           unowned_scale=unowned_scale)
    assert_matches_reference(run(problem), problem)


@pytest.mark.parametrize("heads", [(8, 8), (8, 1), (12, 4)], ids=["mha", "mqa", "gqa3"])
def test_head_groups(heads):
    problem = make_paged_problem(STEP, num_heads=heads[0], num_kv_heads=heads[1], head_dim=32,
                                 dtype=torch.float32, rising_scores=4.0, seed=4)
    assert_matches_reference(run(problem), problem)


def test_one_kernel_call_for_every_short_sequence_and_sdpa_for_the_rest():
    problem = make_paged_problem(STEP, dtype=torch.float32)
    plan = cpp_backend.plan_cpp_step(problem.meta, torch.device("cpu"), torch.float32)
    short = [i for i, s in enumerate(STEP) if s.new == 1 or (s.new <= 16 and s.context > 0)]
    assert plan.seq_lens.tolist() == [STEP[i].new + STEP[i].context for i in short]
    assert plan.query_start.tolist()[-1] == plan.short_rows.shape[0] == sum(STEP[i].new for i in short)
    assert [(p.stop - p.start, p.context_len) for p in plan.prefills] == [(23, 0), (17, 32)]


def test_the_kernel_refuses_what_it_cannot_read():
    problem = make_paged_problem([Seq(new=1, context=5)], dtype=torch.float32)
    k_cache, v_cache = problem.caches()
    meta = problem.meta
    kernel = cpp_backend.paged_attention_cpu
    with pytest.raises(RuntimeError, match="must be int32"):
        kernel(problem.query, k_cache, v_cache, meta.block_tables.long(), meta.seq_lens, meta.query_start_loc, 1.0)
    with pytest.raises(RuntimeError, match="not a multiple of 2 KV heads"):
        kernel(problem.query[:, :5], k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc, 1.0)
    with pytest.raises(RuntimeError, match="cache dtype Double"):
        kernel(problem.query, k_cache.double(), v_cache.double(), meta.block_tables, meta.seq_lens,
               meta.query_start_loc, 1.0)
    with pytest.raises(RuntimeError, match="one table and one length per sequence"):
        kernel(problem.query, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc[:1], 1.0)


def test_the_backend_refuses_a_cache_it_cannot_read():
    backend = get_attention_backend("cpp")
    with pytest.raises(ValueError, match="runs on the CPU, not on meta"):
        backend.check_kv_cache(16, torch.float32, torch.device("meta"))
    with pytest.raises(ValueError, match="float64"):
        backend.check_kv_cache(16, torch.float64, torch.device("cpu"))


def test_auto_falls_back_to_the_torch_backend_where_the_kernel_does_not_build(monkeypatch):
    monkeypatch.setattr(cpp_backend, "kernel_status", lambda: "no compiler here")
    with pytest.warns(RuntimeWarning, match="no compiler here; using attention_backend='torch'"):
        assert get_attention_backend("auto", "cpu").name == "torch"
    monkeypatch.undo()
    assert get_attention_backend("auto", "cpu").name == "cpp"
    assert attention.BACKENDS["cpp"]().name == "cpp"


@pytest.mark.parametrize("num_heads, head_dim", [(6, 32), (8, 32), (4, 64)], ids=["group3", "group4", "d64"])
def test_the_heads_of_a_group_give_what_each_gives_alone(num_heads, head_dim):
    """The kernel sums the values of up to four query heads of a KV head together, and takes the
    scores eight keys at a time: each head's output must be the float it is when that head is
    the only one of its group (kept apart from the grouping, to the bit)."""
    problem = make_paged_problem(STEP, num_heads=num_heads, num_kv_heads=2, head_dim=head_dim, seed=5,
                                 dtype=torch.float32)
    k_cache, v_cache = problem.caches(after=True)
    meta, group = problem.meta, num_heads // 2
    together = cpp_backend.paged_attention_cpu(problem.query, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                               meta.query_start_loc, problem.scale)
    for j in range(group):
        heads = [kv * group + j for kv in range(2)]  # head j of each KV head: groups of one
        alone = cpp_backend.paged_attention_cpu(problem.query[:, heads].contiguous(), k_cache, v_cache,
                                                meta.block_tables, meta.seq_lens, meta.query_start_loc, problem.scale)
        assert torch.equal(together[:, heads], alone), f"head {j} of each group"


def test_a_build_killed_midway_does_not_hang_the_next_process():
    """torch's loader locks the build directory with a file; a process killed while building
    leaves it behind. The next process must still load the kernels, not wait for ever."""
    import fcntl
    import subprocess
    import sys

    from minivllm import cpu_kernels

    directory = cpu_kernels.build_directory()
    with open(directory / "minivllm.lock", "w") as handle:  # as a builder would hold it
        fcntl.flock(handle, fcntl.LOCK_EX)
        (directory / "lock").write_text("")  # what the killed builder left
        fcntl.flock(handle, fcntl.LOCK_UN)
    done = subprocess.run([sys.executable, "-c", "from minivllm.cpu_kernels import load_kernels; load_kernels()"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (directory / "lock").exists()


def test_a_build_says_what_it_is_doing_once(tmp_path):
    """The first use on a machine compiles the kernels for about a minute: it says so on stderr
    (what, and about how long), and says nothing when they are only loaded. Here the compiled
    object is kept and only the module is missing, so the "build" is a link, not a minute."""
    import os
    import shutil
    import subprocess
    import sys

    from minivllm import cpu_kernels

    if cpu_kernels.kernel_status() is not None:
        pytest.skip(cpu_kernels.kernel_status())
    built = cpu_kernels.build_directory()
    copy = tmp_path / built.name
    shutil.copytree(built, copy, ignore=shutil.ignore_patterns("lock", "minivllm.lock"))
    for module in copy.glob(f"{cpu_kernels.EXTENSION_NAME}.so"):
        module.unlink()
    assert cpu_kernels.needs_build(copy)
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    load = [sys.executable, "-c", "from minivllm.cpu_kernels import load_kernels; load_kernels(); load_kernels()"]
    first = subprocess.run(load, capture_output=True, text=True, timeout=600, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stderr.count("compiling its C++ CPU kernels") == 1, first.stderr
    assert "about a minute" in first.stderr and "the C++ CPU kernels are built" in first.stderr
    assert not cpu_kernels.needs_build(copy)
    again = subprocess.run(load, capture_output=True, text=True, timeout=600, env=env)
    assert again.returncode == 0 and "compiling" not in again.stderr, again.stderr
