"""The course's KV tools: block-map frames and their recorder, the trace replay that grades
exercises 04 and 07, loading benchmarks, and the memory of ``course.working``."""

from __future__ import annotations

import builtins
import shutil

import matplotlib
import pytest

from minivllm import course
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.course import blockmap, verdicts
from minivllm.course.grading import Mismatch
from minivllm.course.kv_replay import KVSetup, TraceRequest, compare_with_minivllm, replay
from minivllm.request import Request

matplotlib.use("Agg")


def _run(kv, request, n):
    kv.allocate_slots(request, n)
    request.num_computed_tokens += n
    kv.commit_written_blocks()


def test_snapshot_counts_owners_fill_and_cached_blocks():
    kv = KVCacheManager(num_blocks=6, block_size=4)
    a = Request("a", list(range(1, 7)))  # 6 tokens: block 0 full, block 1 holds 2
    _run(kv, a, 6)
    b = Request("b", list(a.all_token_ids))
    b.num_computed_tokens = 6
    kv.fork(a, b)
    frame = blockmap.snapshot(kv, [a, b], "forked")
    assert frame.tables == {"a": [0, 1], "b": [0, 1]}
    assert frame.ref_counts()[:3] == [2, 2, 0] and frame.fill()[:3] == [4, 2, 0]
    assert frame.num_used == 2 and frame.cached == {0} and frame.cached_free == []
    kv.free(a)
    kv.free(b)
    after = blockmap.snapshot(kv, {"a": 0, "b": 0})
    assert after.tables == {} and after.cached_free == [0]
    assert after.free_queue[-2:] == [1, 0]  # tail first: the cached prefix is evicted last
    assert "0 of 6 blocks in use; free but cached: [0]" in after.table_text()


def test_the_recorder_sees_admissions_forks_copies_and_finishes():
    from minivllm import LLM, SamplingParams

    recorder = blockmap.BlockMapRecorder()
    llm = LLM(max_model_len=64, num_kv_blocks=16, engine_core=recorder.core, debug_checks=True)
    llm.generate(["Once upon a time"], SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=6), use_tqdm=False)
    captions = [f.caption for f in recorder.frames]
    assert "admitted" in captions[0] and "forked into" in captions[0]
    assert "copy-on-write" in captions[1] and recorder.frames[1].copies
    assert "finished" in captions[-1] and recorder.frames[-1].tables == {}
    assert len(recorder.frames) == llm.stats().num_steps
    shared = recorder.frames[0]
    assert max(shared.ref_counts()) == 2  # leader and sibling share the prompt's block
    assert 0 in blockmap.key_frames(recorder.frames) and len(blockmap.key_frames(recorder.frames, k=3)) <= 3


def test_pictures_draw_without_a_display_and_without_ipywidgets(monkeypatch, capsys):
    import matplotlib.pyplot as plt

    kv = KVCacheManager(num_blocks=10, block_size=4)
    a, b = Request("a", list(range(1, 10))), Request("b", list(range(20, 25)))
    frames = []
    for req, n in ((a, 9), (b, 5)):
        _run(kv, req, n)
        frames.append(blockmap.snapshot(kv, [a, b], f"{req.request_id} admitted"))
    ax = blockmap.draw_block_map(frames[-1])
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:2] == ["a", "b"] and "free" in labels and "free, cached prefix" not in labels
    fig = blockmap.plot_key_frames(frames, indices=[0, 1])
    assert len(fig.axes) == 2
    plt.close("all")
    real_import = builtins.__import__

    def no_widgets(name, *args, **kwargs):
        if name == "ipywidgets":
            raise ImportError("no ipywidgets here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_widgets)
    monkeypatch.setattr(plt, "show", lambda *a, **k: None)
    blockmap.show_block_maps(frames)
    out = capsys.readouterr().out
    assert "a admitted" in out and "b (  5 tokens): [3, 4]" in out
    plt.close("all")


class _Liar(KVCacheManager):
    """Reports one block fewer in use than it holds."""

    @property
    def num_used_blocks(self):
        return max(super().num_used_blocks - 1, 0)

    @property
    def num_free_blocks(self):
        return self.num_blocks - self.num_used_blocks


TRACE = [TraceRequest(f"r{i}", tuple(range(1 + i, 9 + i)), 6, arrival_step=i) for i in range(5)]
SETUP = KVSetup(num_blocks=10, block_size=4, max_num_seqs=2)


def _ex04():
    return course.load("ex04_block_allocator", solutions=True)


class _Leaky:
    """Exercise 04's reference manager, except that ``free`` forgets a request's last block."""

    def __new__(cls, num_blocks, block_size):
        kv = _ex04().PagedKVCacheManager(num_blocks, block_size)
        real_free = kv.free

        def free(request):
            table = kv.tables.get(request.request_id)
            if table and len(table) > 1:
                table.pop()
            real_free(request)

        kv.free = free
        return kv


class _StackPool:
    """Exercise 04's reference manager over a pool that hands out the block freed last first:
    other block ids, the same decisions."""

    def __new__(cls, num_blocks, block_size):
        kv = _ex04().PagedKVCacheManager(num_blocks, block_size)
        pool, real_allocate = kv.pool, kv.pool.allocate

        def allocate(n):
            if n > pool.num_free_blocks:
                return real_allocate(n)
            taken = [pool.free_queue.popitem()[0] for _ in range(n)]
            for block in taken:
                pool.ref_counts[block] = 1
            return taken

        pool.allocate = allocate
        return kv


def test_replay_compares_decisions_not_block_ids_and_audits_the_pool():
    assert compare_with_minivllm(lambda: _ex04().PagedKVCacheManager(10, 4), TRACE, SETUP, caching=False) > 5
    assert compare_with_minivllm(lambda: _StackPool(10, 4), TRACE, SETUP, caching=False) > 5
    with pytest.raises((Mismatch, AssertionError)):
        compare_with_minivllm(lambda: _Leaky(10, 4), TRACE, SETUP, caching=False)


def test_replay_catches_wrong_pool_accounting():
    with pytest.raises(AssertionError, match="in use"):
        replay(_Liar(10, 4, enable_caching=False), TRACE, SETUP)


def test_load_benchmark_reuses_the_scripts():
    claims = course.load_benchmark("chapter_claims")
    report = claims.Report()
    claims.claim_kv_bytes(claims.Config.make(quick=True, seed=0), report)
    assert "320 KiB/token" in report.rows[0].ours
    with pytest.raises(FileNotFoundError, match="no_such_benchmark"):
        course.load_benchmark("no_such_benchmark")


def test_working_remembers_a_verdict_until_an_exercise_file_changes(tmp_path, monkeypatch, capsys):
    for folder in ("solutions", "exercises"):
        (tmp_path / folder).mkdir()
    source = course.course_root() / "solutions" / "ex01_static_waste.py"
    shutil.copy(source, tmp_path / "solutions" / source.name)
    shutil.copy(source, tmp_path / "exercises" / source.name)
    monkeypatch.setenv("MINIVLLM_COURSE_ROOT", str(tmp_path))
    runs = []
    real = verdicts.run_cases
    monkeypatch.setattr(verdicts, "run_cases", lambda *a, **k: runs.append(a[0]) or real(*a, **k))
    assert course.working("ex01_static_waste").__course_source__ in ("exercises", "solutions")
    course.working("ex01_static_waste")
    assert len(runs) == 1  # the second call reused the verdict
    student = tmp_path / "exercises" / source.name
    right = "acc.idle_rows += sum(longest_out - n for n in outs)"
    assert right in student.read_text(), "ex01 changed: pick another line to break"
    student.write_text(student.read_text().replace(right, "acc.idle_rows += 0"))
    assert course.working(course.load("ex01_static_waste", solutions=False)).__course_source__ == "solutions"
    assert len(runs) == 2 and "does not pass its checks yet" in capsys.readouterr().out
