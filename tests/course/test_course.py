"""The course machinery: exercise generation, loading, grading, the CLI, and the mutation suite
(plausible wrong answers, each of which must fail its exercise; tests/course/test_grader_validation.py
holds the other two legs of the grader's validation: the reference passes, the stubs score zero)."""

from __future__ import annotations

import ast
import itertools
import re
import sys
import textwrap
from pathlib import Path

import pytest

from minivllm import course
from minivllm.cli import main as cli_main
from minivllm.course import exgen
from minivllm.course.grading import TODO, run_case, run_cases
from minivllm.course.loader import load_path

ROOT = course.course_root()
NAMES = course.exercise_names()


def test_there_are_exercises():
    assert {"ex00_kv_memory", "ex01_static_waste", "ex02_continuous", "ex03_chunked_prefill",
            "ex04_block_allocator", "ex05_paged_attention_ref", "ex06_triton_kernel",
            "ex07_prefix_cache", "ex08_engine_step"} <= set(NAMES)


# --- exercises/ is generated from solutions/ -----------------------------------------------------
@pytest.mark.skipif(not course.use_solutions(), reason="students edit exercises/; maintainers run with MINIVLLM_SOLUTIONS=1")
def test_committed_exercises_are_up_to_date():
    stale = exgen.stale_exercises(ROOT)
    assert not stale, f"out of date: {stale}; run `minivllm course make-exercises`"


@pytest.mark.parametrize("name", NAMES)
def test_stub_keeps_no_solution_line(name):
    solution = (ROOT / "solutions" / f"{name}.py").read_text()
    stub = exgen.make_exercise(solution, name)
    for region in exgen.find_regions(solution):
        body = solution.splitlines()[region.begin + 1 : region.end]
        for line in body:
            code = line.strip()
            if len(code) > 25 and not code.startswith("#"):  # short lines (return x) may recur
                assert code not in stub, f"{name}: solution line leaked into the stub: {code!r}"


@pytest.mark.parametrize("name", NAMES)
def test_solution_declares_its_notebook_and_has_cases(name):
    """Its cases are what tests/exercises/test_cases.py runs (a module of its own is optional)."""
    text = (ROOT / "solutions" / f"{name}.py").read_text()
    m = re.search(r'^NOTEBOOK = "(notebooks/\d\d_\w+\.ipynb)"', text, re.M)
    assert m, f"solutions/{name}.py needs NOTEBOOK = \"notebooks/NN_name.ipynb\""
    assert name.split("_")[0] == "ex" + Path(m.group(1)).name[:2], "exercise and notebook numbers differ"
    assert course.cases_for(name), f"no cases in minivllm/course/checks/{name}.py"


# --- the generator ----------------------------------------------------------------------------------
SAMPLE = textwrap.dedent(
    '''\
    NOTEBOOK = "notebooks/99_demo.ipynb"

    def area(w, h):
        """Rectangle area, in square units. Both sides must be >= 0."""
        # BEGIN SOLUTION
        return w * h
        # END SOLUTION

    class Box:
        def volume(self):
            base = 2
            # BEGIN SOLUTION
            return base * 3
            # END SOLUTION
    '''
)


def test_generator_replaces_regions_with_stubs_that_state_the_contract():
    out = exgen.make_exercise(SAMPLE, "ex99_demo")
    assert "return w * h" not in out and "return base * 3" not in out
    # the docstring's first sentence says what to do; the hints come from course.hint
    assert ("raise NotImplementedError(\"ex99 area: Rectangle area, in square units. Yours to write; "
            "stuck? course.hint('ex99') (notebooks/99_demo.ipynb)\")") in out
    assert "        raise NotImplementedError(\"ex99 Box.volume: yours to write; stuck? course.hint('ex99')" in out
    assert "base = 2" in out  # code outside the region is kept
    assert out.startswith("# This file is generated from solutions/ex99_demo.py")
    assert 'course.hint("ex99")' in out.splitlines()[2]
    ns: dict = {}
    exec(compile(out, "ex99", "exec"), ns)
    with pytest.raises(NotImplementedError, match="area"):
        ns["area"](2, 3)


def test_generator_refuses_a_hint_in_the_solution():
    """Hints live in minivllm/course/hints/, one at a time; a stub never carries them."""
    with_hint = SAMPLE.replace("    # BEGIN SOLUTION\n    return w * h",
                               "    # HINT: width times height\n    #   nothing more\n"
                               "    # BEGIN SOLUTION\n    return w * h")
    assert with_hint != SAMPLE
    with pytest.raises(exgen.SolutionFormatError, match="hints live in minivllm/course/hints"):
        exgen.make_exercise(with_hint, "ex99_demo")


def test_a_long_contract_points_at_the_docstring():
    long_doc = SAMPLE.replace("Rectangle area, in square units.", "Rectangle area " + "and more " * 20 + ".")
    assert "ex99 area: What it must do is in its docstring. Yours to write" in exgen.make_exercise(long_doc, "ex99_demo")


@pytest.mark.parametrize(
    "bad, message",
    [
        ("def f():\n    # BEGIN SOLUTION\n    return 1\n", "never closed"),
        ("def f():\n    return 1\n    # END SOLUTION\n", "without BEGIN"),
        ("# BEGIN SOLUTION\nx = 1\n# END SOLUTION\n", "inside a function"),
        ("def f():\n    # BEGIN SOLUTION\n    return 1\n  # END SOLUTION\n", "indented"),
        ("def f():\n    # BEGIN SOLUTION\n    # BEGIN SOLUTION\n", "inside another"),
        ("def f():\n    # BEGIN SOLUTIONS\n    return 1\n", "malformed"),
        ("def f():\n    return 1\n", "no # BEGIN SOLUTION"),
    ],
)
def test_generator_rejects_malformed_markers(bad, message):
    with pytest.raises(exgen.SolutionFormatError, match=message):
        exgen.make_exercise(bad, "ex99_bad")


def test_write_exercises_into_a_copy(tmp_path):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "ex99_demo.py").write_text(SAMPLE)
    assert exgen.stale_exercises(tmp_path) == ["exercises/ex99_demo.py"]
    assert exgen.write_exercises(tmp_path) == ["exercises/ex99_demo.py"]
    assert exgen.stale_exercises(tmp_path) == []
    assert exgen.write_exercises(tmp_path) == []  # nothing changed, nothing written


# --- loading ---------------------------------------------------------------------------------------
def test_load_follows_the_environment(monkeypatch):
    monkeypatch.setenv("MINIVLLM_SOLUTIONS", "1")
    assert course.load("ex01").__course_source__ == "solutions"
    monkeypatch.setenv("MINIVLLM_SOLUTIONS", "0")
    assert course.load("ex01").__course_source__ == "exercises"
    assert course.load("1", solutions=True).__course_source__ == "solutions"


def test_names_resolve_and_unknown_names_fail():
    assert course.loader.resolve_name("2") == "ex02_continuous"
    assert course.loader.resolve_name("ex03") == "ex03_chunked_prefill"
    with pytest.raises(KeyError, match="no exercise"):
        course.loader.resolve_name("ex77")


def test_a_copy_missing_one_file_on_either_side_lists_every_exercise(tmp_path, monkeypatch):
    """The list is the union of solutions/ and exercises/: a copy without the reference
    ex11 (or without the student's ex10) still lists and loads the exercise it has."""
    for folder in ("solutions", "exercises"):
        (tmp_path / folder).mkdir()
        for name in NAMES:
            (tmp_path / folder / f"{name}.py").write_text((ROOT / folder / f"{name}.py").read_text())
    (tmp_path / "solutions" / "ex11_spec_verify.py").unlink()
    (tmp_path / "exercises" / "ex10_costs.py").unlink()
    monkeypatch.setenv("MINIVLLM_COURSE_ROOT", str(tmp_path))
    monkeypatch.delenv("MINIVLLM_SOLUTIONS", raising=False)
    assert course.exercise_names() == NAMES
    assert course.load("ex11").__course_source__ == "exercises"
    assert course.load("ex10", solutions=True).__course_source__ == "solutions"
    with pytest.raises(FileNotFoundError, match="no reference solution for ex11_spec_verify"):
        course.load("ex11", solutions=True)


def test_load_gives_a_fresh_module_each_time():
    a, b = course.load("ex00", solutions=True), course.load("ex00", solutions=True)
    assert a is not b and a.kv_bytes_per_token is not b.kv_bytes_per_token


# --- checks catch plausible wrong answers ------------------------------------------------------------
# exercise 08's step, in pieces that the mutants below move around
_EX08_COMMIT = "        kv.commit_written_blocks()  # the K/V exists now, and nothing of the step is freed yet\n"
_EX08_EXEC = "        try:\n            result = self.executor.execute(plan)\n"
_EX08_UPDATE = "        appended = sched.update_from_output(plan, tokens)\n        end = self.clock()\n"
_EX08_STAMP_SCHEDULED = ("        for req in plan.requests:\n            if req.first_scheduled_time is None:\n"
                         "                req.first_scheduled_time = start\n")
_EX08_ENDED = "        ended = [d for d in appended if d.finish_reason is not None]\n"
_EX08_FINISH = ("        for d in ended:  # after the first-token times: the statistics keep what they read\n"
                "            self.record_finish(stepped[d.request_id], end)\n")
_EX08_FIRST_TOKENS = "        for req in stepped.values():\n"
_EX08_FAIL_PLAN = "            deltas = self.fail_requests({r.request_id: message for r in plan.requests})\n"
_EX08_SOLUTION = (ROOT / "solutions" / "ex08_engine_step.py").read_text()
# from the executor's call to the commit, and from the commit to the update, as the solution has them
_EX08_RUN_TO_COMMIT = _EX08_SOLUTION[_EX08_SOLUTION.index(_EX08_EXEC):_EX08_SOLUTION.index(_EX08_COMMIT) + len(_EX08_COMMIT)]
_EX08_COMMIT_TO_UPDATE = _EX08_SOLUTION[_EX08_SOLUTION.index(_EX08_COMMIT):_EX08_SOLUTION.index(_EX08_UPDATE) + len(_EX08_UPDATE)]
_EX08_FAIL_ROWS = "        deltas = self.fail_requests(result.failed)\n"
_EX08_COMMIT_TO_FAIL_ROWS = _EX08_SOLUTION[_EX08_SOLUTION.index(_EX08_COMMIT):
                                           _EX08_SOLUTION.index(_EX08_FAIL_ROWS) + len(_EX08_FAIL_ROWS)]
_EX08_RERAISE = ("            if not isinstance(err, Exception):  # Ctrl-C: the engine is consistent; pass it on\n"
                 "                raise\n")
_EX08_OUTPUT = "        return self.step_outputs(plan, start, end, deltas + appended, result)\n"

# ex11's solution lines that several mutants change
EX11_KEEP = "kept = has_draft & (uniforms * q_draft < p_draft)"
EX11_LEFT = "leftover = (target_probs - draft_probs).clamp(min=0.0)"
EX11_LAST = "weights = torch.where(has_draft[:, None], leftover, target_probs)"

MUTANTS = [
    ("ex00_kv_memory", 'config.get("head_dim") or config["hidden_size"] // heads', 'config["hidden_size"] // heads'),
    ("ex00_kv_memory", "return 2 * layers * kv_heads", "return layers * kv_heads"),
    ("ex00_kv_memory", "if slope <= 0:", "if slope < 0:"),
    ("ex00_kv_memory", "-(-num_tokens // block_size) * block_size", "num_tokens // block_size * block_size"),
    # every query head counted as if it had its own K and V (GQA ignored)
    ("ex00_kv_memory", "return 2 * layers * kv_heads", "return 2 * layers * heads"),
    # a multiply-add counted as one FLOP
    ("ex00_kv_memory", "flops = 2 * num_params * batch_size", "flops = num_params * batch_size"),
    # reaching the ridge exactly not counted as compute-bound
    ("ex00_kv_memory", "while decode_intensity(batch, num_params, weight_bytes, kv_bytes_per_seq) < ridge:",
     "while decode_intensity(batch, num_params, weight_bytes, kv_bytes_per_seq) <= ridge:"),
    # ex01: one step too many per batch (the prefill's first token forgotten)
    ("ex01_static_waste", "acc.num_steps += longest_out", "acc.num_steps += longest_out + 1"),
    # the prefill's token counted again in decode
    ("ex01_static_waste", "acc.decode_rows += sum(n - 1 for n in outs)", "acc.decode_rows += sum(outs)"),
    # every prompt padded to the longest of the whole trace
    ("ex01_static_waste", "longest_prompt, longest_out = max(prompts), max(outs)",
     "longest_prompt, longest_out = max(prompt_lens), max(outs)"),
    # the empty seats of a partial last batch counted as padding / idle rows
    ("ex01_static_waste", "len(prompts) * longest_prompt", "batch_size * longest_prompt"),
    ("ex01_static_waste", "acc.idle_rows += sum(longest_out - n for n in outs)",
     "acc.idle_rows += batch_size * longest_out - sum(outs)"),
    # the straggler's wait forgotten
    ("ex01_static_waste", "acc.idle_rows += sum(longest_out - n for n in outs)", "acc.idle_rows += 0"),
    # no check that the two lists match
    ("ex01_static_waste", "if len(prompt_lens) != len(output_lens):", "if False:"),
    ("ex01_static_waste", "if output_lens and min(output_lens) < 1:", "if False:"),
    # ex02: a prompt that exactly fills the budget refused
    ("ex02_continuous", "if req.num_tokens > budget:", "if req.num_tokens >= budget:"),
    # the newest running request decoded first
    ("ex02_continuous", "for req in self.running:  # one token each, the oldest first",
     "for req in reversed(self.running):  # one token each, the oldest first"),
    # a smaller prompt overtakes the head of the queue
    ("ex02_continuous", "if req.num_tokens > budget:\n                break",
     "if req.num_tokens > budget:\n                self.waiting.rotate(-1)\n                break"),
    # one seat too many
    ("ex02_continuous", "len(self.running) < self.config.max_num_seqs", "len(self.running) <= self.config.max_num_seqs"),
    # the seats counted once, before the step's admissions
    ("ex02_continuous", "while self.waiting and len(self.running) < self.config.max_num_seqs:",
     "seats = self.config.max_num_seqs - len(self.running)\n        while self.waiting and seats > 0:"),
    # the decodes not paid from the budget
    ("ex02_continuous", "            budget -= 1\n", "            budget -= 0\n"),
    # a decode that does not advance num_computed_tokens
    ("ex02_continuous", "req.num_computed_tokens += 1", "pass"),
    # a request that does not fit the pool skipped instead of waited for
    ("ex02_continuous", "break  # no room for its prompt yet: it waits, and everyone behind it too",
     "self.waiting.rotate(-1)\n                break"),
    # the length cap forgotten
    ("ex02_continuous", "req.check_stop(token, self.config.max_model_len)", "req.check_stop(token, 10**9)"),
    # a finished request keeps its KV blocks
    ("ex02_continuous", "self.kv.free(req)", "pass"),
    # a finished request stays in self.requests
    ("ex02_continuous", "del self.requests[req.request_id]", "pass"),
    # an admitted request never marked RUNNING
    ("ex02_continuous", "req.status = RequestStatus.RUNNING", "pass"),
    # an aborted request keeps its blocks
    ("ex02_continuous", "self.kv.free(req)\n            req.status = status", "req.status = status"),
    # an aborted request that was running stays in the batch
    ("ex02_continuous", "if req in self.running:\n                self.running.remove(req)\n            else:\n"
     "                self.waiting.remove(req)", "if req not in self.running:\n                self.waiting.remove(req)"),
    # finish_requests ends the requests but does not say which
    ("ex02_continuous", "            req.status = status\n        return ended", "            req.status = status\n        return []"),
    # update_from_output returns no delta
    ("ex02_continuous", "            del self.requests[req.request_id]\n        return deltas",
     "            del self.requests[req.request_id]\n        return []"),
    # a delta only for the requests that ended
    ("ex02_continuous", "            deltas.append(delta)", "            deltas.append(delta) if status else None"),
    # a request given several tokens in one step: only the first kept; tokens after a stop kept too
    ("ex02_continuous", "            for i, token in enumerate(tokens):", "            for i, token in enumerate(tokens[:1]):"),
    ("ex02_continuous", "                    break\n            deltas.append(delta)", "            deltas.append(delta)"),
    # the delta of a request that ended keeps the tokens after its stop (the request does not)
    ("ex02_continuous", "RequestDelta(rid, tokens[: i + 1], status.finish_reason", "RequestDelta(rid, tokens, status.finish_reason"),
    # the delta of a request that ended does not say how
    ("ex02_continuous", "status.finish_reason, req.stop_reason)", "None, req.stop_reason)"),
    # ... or which stop token ended it
    ("ex02_continuous", "status.finish_reason, req.stop_reason)", "status.finish_reason)"),
    # ex03: a request still prefilling gets one token per step, as if it were decoding
    ("ex03_chunked_prefill", "num_new = min(req.num_tokens - req.num_computed_tokens, budget)", "num_new = 1"),
    # admission still wants the whole prompt
    ("ex03_chunked_prefill", "num_new = min(req.num_tokens, budget)", "num_new = req.num_tokens"),
    # the oldest running request preempted instead of the newest
    ("ex03_chunked_prefill", "victim = self.running.pop()", "victim = self.running.pop(0)"),
    # admissions continue in a step that preempted
    ("ex03_chunked_prefill", "if out.preempted:\n            return out", "if False:\n            return out"),
    # a request that preempted itself keeps trying
    ("ex03_chunked_prefill", "if victim is req:\n                    break", "if victim is req:\n                    pass"),
    # a request preempted earlier in the step scheduled anyway
    ("ex03_chunked_prefill", "if req.status is not RequestStatus.RUNNING:\n                continue",
     "if False:\n                continue"),
    # a victim keeps its blocks
    ("ex03_chunked_prefill", "self.kv.free(victim)", "pass"),
    # a victim resumes from where it was instead of recomputing
    ("ex03_chunked_prefill", "victim.num_computed_tokens = 0", "pass"),
    # a victim sent to the back of the queue
    ("ex03_chunked_prefill", "self.waiting.appendleft(victim)", "self.waiting.append(victim)"),
    # a step's victims put back newest first (two preemptions in one step: the newest at the head)
    ("ex03_chunked_prefill", "self.waiting.appendleft(victim)", "self.waiting.insert(len(out.preempted) - 1, victim)"),
    # a preemption not counted on the request
    ("ex03_chunked_prefill", "victim.num_preemptions += 1", "pass"),
    # a victim not reported in the step's plan
    ("ex03_chunked_prefill", "out.preempted.append(victim)", "pass"),
    # a victim left with status RUNNING
    ("ex03_chunked_prefill", "victim.status = RequestStatus.PREEMPTED", "pass"),
    # steps_to_first_token ignoring the decodes (passed every case before (1000, 100, 50) -> 20)
    ("ex03_chunked_prefill", "per_step = token_budget - num_decoding", "per_step = token_budget"),
    ("ex03_chunked_prefill", "if per_step <= 0:", "if per_step < 0:"),
    ("ex03_chunked_prefill", "return -(-prompt_len // per_step)", "return prompt_len // per_step"),
    # ex10: the roofline's plausible slips, one per mutant
    ("ex10_costs", "kv_read = batch_size * (context_len + 1) * kv", "kv_read = 0"),  # KV reads forgotten
    ("ex10_costs", "kv_written = batch_size * kv", "kv_written = 0"),  # KV writes forgotten
    ("ex10_costs", "return max(compute, memory) +", "return compute + memory +"),  # sum, not max
    ("ex10_costs", "max(compute, memory) + assumptions.step_overhead_s", "max(compute, memory)"),  # no overhead
    ("ex10_costs", "return tokens_per_s * SECONDS_PER_HOUR / usd_per_hour", "return tokens_per_s / usd_per_hour"),  # $/h as $/s
    ("ex10_costs", "return batch_size / decode_step_time(", "return 1 / decode_step_time("),  # batch not multiplying
    ("ex10_costs", "return float(weights + kv_read", "return float(batch_size * weights + kv_read"),  # weights per sequence
    ("ex10_costs", "head_dim * (context_len + 1)", "head_dim * context_len"),  # own key not attended
    ("ex10_costs", "matmuls + attention + lm_head", "matmuls + attention"),  # LM head FLOPs forgotten
    # attention: counted over the KV heads (GQA shares K/V, not the queries' work), or QK^T alone
    ("ex10_costs", "model.num_layers * model.num_heads * model.head_dim", "model.num_layers * model.num_kv_heads * model.head_dim"),
    ("ex10_costs", "attention = 4 * model.num_layers", "attention = 2 * model.num_layers"),
    ("ex10_costs", "weights = model.body_weight_bytes + model.lm_head_bytes", "weights = model.body_weight_bytes"),
    ("ex10_costs", "(hardware.peak_flops * assumptions.flops_efficiency)", "hardware.peak_flops"),  # datasheet peak
    ("ex10_costs", "if not usd_per_hour > 0:", "if usd_per_hour < 0:"),
    ("ex10_costs", "gpu_seconds = latency / batch_size", "gpu_seconds = latency"),  # GPU not shared
    ("ex10_costs", "batch_size, prompt_len + i, assumptions)", "batch_size, prompt_len, assumptions)"),  # cache not growing
    ("ex10_costs", "batch_size, prompt_len + i, assumptions)", "batch_size, prompt_len + i)"),  # assumptions dropped
    # ex11: the verifier's plausible slips: the keep test, the residual, the token after all
    # drafts; then the whole step's layout (each request's first stop, its own rows), and the
    # work rule (right answers from a loop that runs tensor operations per row or per request)
    ("ex11_spec_verify", EX11_KEEP, "kept = has_draft & (uniforms * p_draft < q_draft)"),  # min(1, q/p)
    ("ex11_spec_verify", EX11_KEEP, "kept = has_draft & (uniforms < p_draft)"),  # q ignored
    ("ex11_spec_verify", EX11_KEEP, "kept = has_draft & (uniforms * q_draft <= p_draft)"),  # u = 0 keeps p = 0
    ("ex11_spec_verify", "kept = has_draft & (uniforms < p_draft)", "kept = has_draft & (uniforms <= p_draft)"),
    ("ex11_spec_verify", EX11_KEEP, "kept = has_draft & (uniforms[0] * q_draft < p_draft)"),  # one uniform
    ("ex11_spec_verify", EX11_KEEP,
     "kept = has_draft & (uniforms * draft_probs[0][index[:, 0]] < p_draft)"),  # q read from the step's row 0
    ("ex11_spec_verify", EX11_LEFT, "leftover = target_probs.clone()"),  # residual p
    ("ex11_spec_verify", EX11_LEFT, "leftover = target_probs - draft_probs"),  # not clamped
    ("ex11_spec_verify", EX11_LEFT, "leftover = (target_probs.roll(-1, 0) - draft_probs).clamp(min=0.0)"),  # next row's
    ("ex11_spec_verify", "leftover = target_probs.scatter(1, index, 0.0)", "leftover = target_probs.clone()"),  # keeps the guess
    ("ex11_spec_verify", "    weights = torch.where(weights.sum(dim=1, keepdim=True) > 0, weights, target_probs)\n",
     ""),  # an empty residual drawn from
    ("ex11_spec_verify", "torch.where(weights > 0, weights / noise, -1.0).argmax(dim=1)",
     "weights.argmax(dim=1)"),  # argmax, no draw
    ("ex11_spec_verify", "torch.where(weights > 0, weights / noise, -1.0).argmax(dim=1)",
     "(weights / noise).argmax(dim=1)"),  # an exact 0 of noise lets a token of weight 0 win
    ("ex11_spec_verify", EX11_LAST, "weights = leftover"),  # a request's last row drawn from a residual too
    ("ex11_spec_verify", EX11_LAST,
     "weights = torch.where(has_draft[:, None], leftover, target_probs.roll(1, 0))"),  # from the row before
    ("ex11_spec_verify", 'torch.where(kept, num_rows, rows), reduce="amin")',
     'torch.where(kept, -1, rows), reduce="amax", include_self=False)'),  # the last stop, not the first
    # exact but wasteful: never keeps a draft, always draws from p (the law of the drafts kept is not the best)
    ("ex11_spec_verify", EX11_KEEP + "\n        " + EX11_LEFT, "kept = has_draft & False\n        leftover = target_probs"),
    # kept half as often as the best exact rule allows (the residual then no longer fills the gap)
    ("ex11_spec_verify", EX11_KEEP, "kept = has_draft & (uniforms * q_draft < p_draft / 2)"),
    # the whole step stops at its first rejection: the later requests keep nothing
    ("ex11_spec_verify", "torch.where(kept, num_rows, rows)", "torch.where(kept.cumprod(0).bool(), num_rows, rows)"),
    # a request whose drafts are all kept takes its last token from the next request's first row
    ("ex11_spec_verify", "torch.where(kept, num_rows, rows)", "torch.where(kept, num_rows, rows + (~has_draft).long())"),
    # rows of one request counted as another's (the requests' row counts in the wrong order)
    ("ex11_spec_verify", "torch.tensor([len(d) + 1 for d in draft_tokens], dtype=torch.long",
     "torch.tensor([len(d) + 1 for d in draft_tokens[::-1]], dtype=torch.long"),
    # a draft judged at the row after its own (a request's last draft at the next request's first row)
    ("ex11_spec_verify", "proposed = torch.tensor(flat, dtype=torch.long, device=device)",
     "proposed = torch.tensor(flat, dtype=torch.long, device=device).roll(1)"),
    # right answers, but a loop over rows (every keep test its own operations), over requests (the
    # first stop of each found by its own operations), or one transfer per request
    ("ex11_spec_verify", EX11_KEEP,
     "kept = torch.stack([has_draft[i] & (uniforms[i] * q_draft[i] < p_draft[i]) for i in range(num_rows)])"),
    ("ex11_spec_verify", '    first = first.scatter_reduce(0, owner, torch.where(kept, num_rows, rows), reduce="amin")\n',
     "    first = torch.stack([s + torch.nonzero(~kept[s : s + len(d) + 1])[0, 0] "
     "for s, d in zip(starts, draft_tokens, strict=True)])\n"),
    ("ex11_spec_verify", "decided = torch.stack([first - start, ending[first]]).tolist()",
     "decided = [[int(f - s) for f, s in zip(first, start)], [int(ending[f]) for f in first]]"),
    # ex06: the online softmax without rescaling what was accumulated under the old maximum
    ("ex06_triton_kernel", "acc = acc * alpha[:, None] + tl.dot(p, v", "acc = acc + tl.dot(p, v"),
    ("ex06_triton_kernel", "denom = denom * alpha + tl.sum(p, axis=1)", "denom = denom + tl.sum(p, axis=1)"),
    # the last, partial block read one slot too far
    ("ex06_triton_kernel", "in_seq = logical_block * BLOCK_SIZE + t < seq_len  # [BLOCK_SIZE]",
     "in_seq = logical_block * BLOCK_SIZE + t <= seq_len  # [BLOCK_SIZE]"),
    # the logical block number used as if it were the physical one
    ("ex06_triton_kernel", "k_cache_ptr + physical_block * stride_kb", "k_cache_ptr + logical_block * stride_kb"),
    # every sequence reading the first sequence's block table
    ("ex06_triton_kernel", "tl.load(table + logical_block)", "tl.load(block_tables_ptr + logical_block)"),
    # GQA heads taken as interleaved (head h reads KV head h % num_kv_heads) instead of grouped
    ("ex06_triton_kernel", "heads = kv_head * GROUP + rows", "heads = rows * tl.num_programs(1) + kv_head"),
    # the softmax scale forgotten
    ("ex06_triton_kernel", 'tl.trans(k), input_precision="ieee") * scale', 'tl.trans(k), input_precision="ieee")'),
    # ex06, kernel 1: the logical block read as the physical one; every sequence reading the first
    # one's table; the partial last block read one slot too far; the columns past head_dim copied
    ("ex06_triton_kernel", "    physical = tl.load(block_tables_ptr + seq * stride_bts + logical_block).to(tl.int64)\n    src",
     "    physical = logical_block\n    src"),
    ("ex06_triton_kernel", "block_tables_ptr + seq * stride_bts + logical_block).to(tl.int64)\n    src",
     "block_tables_ptr + logical_block).to(tl.int64)\n    src"),
    ("ex06_triton_kernel", "ok = (pos < length)[:, None]", "ok = (pos <= length)[:, None]"),
    ("ex06_triton_kernel", "ok = (pos < length)[:, None] & (d < HEAD_DIM)[None, :]", "ok = (pos < length)[:, None]"),
    # ex06, kernel 2: the scale forgotten; positions' blocks taken as physical; padded positions
    # scored 0 instead of -inf; query heads paired with KV heads modulo the group
    ("ex06_triton_kernel", "scores = tl.sum(q[None, :] * k, axis=1) * scale", "scores = tl.sum(q[None, :] * k, axis=1)"),
    ("ex06_triton_kernel", "block = tl.load(block_tables_ptr + seq * stride_bts + pos // BLOCK_SIZE, mask=in_seq, other=0)",
     "block = pos // BLOCK_SIZE"),
    ("ex06_triton_kernel", '    scores = tl.where(in_seq, scores, float("-inf"))\n', ""),
    ("ex06_triton_kernel", "kv_head = head // GROUP", "kv_head = head % GROUP"),
    # ex06, kernel 3: the online softmax without rescaling acc, or denom; the maximum never kept
    ("ex06_triton_kernel", "acc = acc * alpha[:, None] + tl.sum(p[:, None] * v, axis=0)[None, :]",
     "acc = acc + tl.sum(p[:, None] * v, axis=0)[None, :]"),
    ("ex06_triton_kernel", "denom = denom * alpha + tl.sum(p, axis=0)", "denom = denom + tl.sum(p, axis=0)"),
    ("ex06_triton_kernel", "        m = m_new\n    result = acc / denom[:, None]\n", "    result = acc / denom[:, None]\n"),
    # ex06, kernel 3 done in two passes: one over the blocks for the maximum, then the sums (right
    # numbers, every block of K loaded twice)
    ("ex06_triton_kernel",
     "    for logical_block in range(0, tl.cdiv(length, BLOCK_SIZE)):\n        physical = tl.load(block_tables_ptr + seq * stride_bts + logical_block).to(tl.int64)\n        in_seq",
     "    for pre_block in range(0, tl.cdiv(length, BLOCK_SIZE)):\n"
     "        pre_phys = tl.load(block_tables_ptr + seq * stride_bts + pre_block).to(tl.int64)\n"
     "        pre_in = pre_block * BLOCK_SIZE + slot < length\n"
     "        pre_k = tl.load(k_cache_ptr + pre_phys * stride_kb + slot_offsets, mask=pre_in[:, None] & d_ok[None, :],"
     " other=0.0).to(tl.float32)\n"
     "        m = tl.maximum(m, tl.max(tl.where(pre_in, tl.sum(q * pre_k, axis=1) * scale, float('-inf')), axis=0))\n"
     "    for logical_block in range(0, tl.cdiv(length, BLOCK_SIZE)):\n        physical = tl.load(block_tables_ptr + seq * stride_bts + logical_block).to(tl.int64)\n        in_seq"),
    # ex06, kernel 2: exp of the raw scores (overflows above 88)
    ("ex06_triton_kernel", "e = tl.exp(scores - tl.max(scores, axis=0))", "e = tl.exp(scores)"),
    # ex06, kernel 5: K loaded twice per block; the weighted values without tl.dot
    ("ex06_triton_kernel", "        v = tl.load(v_cache_ptr + physical_block * stride_vb",
     "        k = tl.load(k_cache_ptr + physical_block * stride_kb + k_in_block, mask=kv_mask, other=0.0)\n"
     "        v = tl.load(v_cache_ptr + physical_block * stride_vb"),
    ("ex06_triton_kernel", 'acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")',
     "acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)"),
    # ex06, kernel 4: a split's range one block short; its log-sum-exp without the maximum; an
    # empty split dividing 0 by 0
    ("ex06_triton_kernel", "last = tl.minimum(first + blocks_per_split, ", "last = tl.minimum(first + blocks_per_split - 1, "),
    ("ex06_triton_kernel", "row + tl.arange(0, 1), m + tl.log(denom))", "row + tl.arange(0, 1), tl.log(denom))"),
    ("ex06_triton_kernel", "    denom = tl.maximum(denom, 1.0)\n", ""),
    # ex06, the reduction: a plain average of the splits; the weighted sum left unnormalised
    ("ex06_triton_kernel", "w = tl.exp(lse - tl.max(lse, axis=0))", "w = tl.where(s_ok, 1.0, 0.0)"),
    ("ex06_triton_kernel", "out = tl.sum(w[:, None] * o, axis=0) / tl.sum(w, axis=0)", "out = tl.sum(w[:, None] * o, axis=0)"),
    # ex05: padding rows (slot -1) stored, at the cache's last slot
    ("ex05_paged_attention_ref", "keep = meta.slot_mapping >= 0",
     "keep = torch.ones_like(meta.slot_mapping, dtype=torch.bool)"),
    # ex05: the causal mask off by one (a token does not see itself; it sees its successor)
    ("ex05_paged_attention_ref", "[None, :] <= own_pos[:, None]", "[None, :] < own_pos[:, None]"),
    ("ex05_paged_attention_ref", "[None, :] <= own_pos[:, None]", "[None, :] <= own_pos[:, None] + 1"),
    # ex05: a chunk's new tokens placed at 0.. instead of after the cached ones
    ("ex05_paged_attention_ref", "own_pos = context + torch.arange(n, device=device)",
     "own_pos = torch.arange(n, device=device)"),
    # ex05: the logical block used as the physical one (a chunk's context; the decode rows)
    ("ex05_paged_attention_ref", "slots = tables[i, pos // block_size] * block_size + pos % block_size",
     "slots = pos"),
    ("ex05_paged_attention_ref", "slots = tables[index[:, None], pos // block_size] * block_size + pos % block_size",
     "slots = index[:, None] * 0 + pos"),
    # ex05: the block size assumed to be 16
    ("ex05_paged_attention_ref", "num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape",
     "num_blocks, _, num_kv_heads, head_dim = k_cache.shape\n        block_size = 16"),
    # ex05: batched decodes padded to the longest without masking the padding (its keys get weight)
    ("ex05_paged_attention_ref",
     "            scores = scores.masked_fill(~owned[:, None, None, :], float(\"-inf\"))\n", ""),
    # ex05: positions past a decode's end read as they are, masked only: 0 * NaN reaches the row
    ("ex05_paged_attention_ref", "            pos = torch.where(owned, pos, 0)\n", ""),
    # ex05: positions past a decode's end sent to global slot 0, masked: NaN wherever block 0 is
    # nobody's (the table's padding entries point there too)
    ("ex05_paged_attention_ref",
     "            pos = torch.where(owned, pos, 0)\n"
     "            slots = tables[index[:, None], pos // block_size] * block_size + pos % block_size\n",
     "            slots = tables[index[:, None], pos // block_size] * block_size + pos % block_size\n"
     "            slots = torch.where(owned, slots, 0)\n"),
    # ex05: the softmax in float32 (right to ~1e-7, not to the float64 tolerance)
    ("ex05_paged_attention_ref", "scores.softmax(dim=-1), v)", "scores.float().softmax(dim=-1).to(v.dtype), v)"),
    # ex05: grouped-query heads interleaved (head h reads KV head h % KVH, as .repeat would tile)
    ("ex05_paged_attention_ref", "q = query[rows].view(len(seqs), num_kv_heads, group, head_dim)",
     "q = query[rows].view(len(seqs), group, num_kv_heads, head_dim).transpose(1, 2)"),
    ("ex05_paged_attention_ref", "q = query[rows].view(n, num_kv_heads, group, head_dim)",
     "q = query[rows].view(n, group, num_kv_heads, head_dim).transpose(1, 2)"),
    # ex05: the softmax scale forgotten, or applied twice
    ("ex05_paged_attention_ref", 'torch.einsum("nkgd,nlkd->nkgl", q, k) * scale', 'torch.einsum("nkgd,nlkd->nkgl", q, k)'),
    ("ex05_paged_attention_ref", 'torch.einsum("nkgd,lkd->kgnl", q, k) * scale',
     'torch.einsum("nkgd,lkd->kgnl", q * scale, k) * scale'),
    # ex05: the softmax taken over the query heads instead of the keys
    ("ex05_paged_attention_ref", 'torch.einsum("kgnl,lkd->nkgd", scores.softmax(dim=-1), v)',
     'torch.einsum("kgnl,lkd->nkgd", scores.softmax(dim=1), v)'),
    # ex05: the step's K/V written into a copy of the cache (a reshape that copied): the
    # outputs are right, the cache the next step reads is not
    ("ex05_paged_attention_ref", "k_slots = k_cache.view(num_blocks * block_size, num_kv_heads, head_dim)",
     "k_slots = k_cache.reshape(num_blocks * block_size, num_kv_heads, head_dim).clone()"),
    # ex05: every decode row on its own (a loop over sequences): the operations grow with the rows
    ("ex05_paged_attention_ref", "buckets.setdefault((blocks - 1).bit_length(), []).append(i)",
     "buckets.setdefault(i, []).append(i)"),
    # ex05: one batch for every decode: short rows padded to the longest
    ("ex05_paged_attention_ref", "buckets.setdefault((blocks - 1).bit_length(), []).append(i)",
     "buckets.setdefault(0, []).append(i)"),
    # ex05: the decodes sent down the prompt path, one at a time
    ("ex05_paged_attention_ref", "            if n == 1:\n", "            if n == -1:\n"),
    ("ex05_paged_attention_ref", "            if n < 2:\n", "            if n < 1:\n"),
    # ex05: K/V repeated once per query head for the prompts and chunks
    ("ex05_paged_attention_ref",
     '            q = query[rows].view(n, num_kv_heads, group, head_dim)\n'
     '            scores = torch.einsum("nkgd,lkd->kgnl", q, k) * scale  # [KVH, group, n, L]\n',
     '            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)\n'
     '            q = query[rows].view(n, num_kv_heads * group, 1, head_dim)\n'
     '            scores = torch.einsum("nkgd,lkd->kgnl", q, k) * scale\n'),
    # ex05: K/V repeated once per query head for the decode rows
    ("ex05_paged_attention_ref",
     '            q = query[rows].view(len(seqs), num_kv_heads, group, head_dim)  # head h: h // group\n'
     '            scores = torch.einsum("nkgd,nlkd->nkgl", q, k) * scale\n',
     '            k, v = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)\n'
     '            q = query[rows].view(len(seqs), num_kv_heads * group, 1, head_dim)\n'
     '            scores = torch.einsum("nkgd,nlkd->nkgl", q, k) * scale\n'),
    # ex04: a block boundary rounded down instead of up
    ("ex04_block_allocator", "need = max(-(-total // bs) - len(held), 0)", "need = max(total // bs - len(held), 0)"),
    # ex04: the lookahead the static scheduler asks for is ignored
    ("ex04_block_allocator", "total = request.num_computed_tokens + num_new_tokens + num_lookahead_tokens",
     "total = request.num_computed_tokens + num_new_tokens"),
    # ex04: the partly filled last block not counted as held
    ("ex04_block_allocator", "need = max(-(-total // bs) - len(held), 0)",
     "need = max(-(-total // bs) - request.num_computed_tokens // bs, 0)"),
    # ex04: a failed allocation keeps the blocks it took before running out
    ("ex04_block_allocator",
     "        if n > len(self.free_queue):\n            raise ValueError(f\"asked for {n} blocks but only {len(self.free_queue)} are free\")\n        taken = []\n        for _ in range(n):\n",
     "        taken = []\n        for _ in range(n):\n            if not self.free_queue:\n                raise ValueError(\"out of blocks\")\n"),
    # ex04: free ignores the other holders of a shared block
    ("ex04_block_allocator", "self.ref_counts[block_id] -= 1\n            if self.ref_counts[block_id] == 0:",
     "self.ref_counts[block_id] = 0\n            if True:"),
    # ex04: a double free goes unnoticed
    ("ex04_block_allocator", "            if drops[block_id] > self.ref_count(block_id):\n                raise ValueError(f\"block {block_id} is already free\")\n", ""),
    # ex04: a free that raises half-way keeps the references it dropped before the bad id
    ("ex04_block_allocator",
     "            if drops[block_id] > self.ref_count(block_id):\n                raise ValueError(f\"block {block_id} is already free\")\n        for block_id in ids:\n",
     "        for block_id in ids:\n            if self.ref_count(block_id) <= 0:\n                raise ValueError(f\"block {block_id} is already free\")\n"),
    # ex04: out-of-range ids not checked (a negative id counts from the end of a list)
    ("ex04_block_allocator", "        if not (isinstance(block_id, int) and 0 <= block_id < self.num_blocks):\n", "        if False:\n"),
    # ex04: touch checks nothing before its first change (a bad id after a good one leaves it touched)
    ("ex04_block_allocator", "        for block_id in ids:\n            self.ref_count(block_id)  # a bad id raises before anything changes\n", ""),
    # ex04: allocate(-1) accepted as allocate(0)
    ("ex04_block_allocator", "        if n < 0:\n            raise ValueError(f\"cannot allocate a negative number of blocks, got {n}\")\n", ""),
    # ex04: the free list used as a stack (the block freed last is reused first)
    ("ex04_block_allocator", "popitem(last=False)", "popitem()"),
    # ex04: touch leaves a free block in the free queue
    ("ex04_block_allocator", "            if self.ref_counts[block_id] == 0:\n                del self.free_queue[block_id]\n", ""),
    # ex04: P7, a touched free block taken out of the queue by rebuilding it (a scan of the queue)
    ("ex04_block_allocator", "                del self.free_queue[block_id]\n",
     "                self.free_queue = type(self.free_queue).fromkeys(b for b in self.free_queue if b != block_id)\n"),
    # ex04: P7, "already free?" answered by searching the free queue
    ("ex04_block_allocator", "            if drops[block_id] > self.ref_count(block_id):\n",
     "            if drops[block_id] > self.ref_count(block_id) or block_id in list(self.free_queue):\n"),
    # ex04: refusing when exactly enough blocks are free
    ("ex04_block_allocator", "if need > self.pool.num_free_blocks:", "if need >= self.pool.num_free_blocks:"),
    # ex04: a refused new request gets an (empty) table all the same
    ("ex04_block_allocator",
     "        if need > self.pool.num_free_blocks:\n            return None\n        if need:\n            self.tables.setdefault(rid, []).extend(",
     "        table = self.tables.setdefault(rid, [])\n        if need > self.pool.num_free_blocks:\n            return None\n"
     "        if need:\n            table.extend("),
    # ex04: a growing table replaced instead of extended
    ("ex04_block_allocator", "self.tables.setdefault(rid, []).extend(self.pool.allocate(need))",
     "self.tables[rid] = self.pool.allocate(need)"),
    # ex04: free gives the blocks back but keeps the table (a second free is a double free)
    ("ex04_block_allocator", "table = self.tables.pop(request.request_id, None)", "table = self.tables.get(request.request_id)"),
    # ex04: check_invariants never looks at who holds blocks
    ("ex04_block_allocator", "extra = {rid for rid, table in self.tables.items() if table} - set(live_request_ids)",
     "extra = set()"),
    # ex04: get_block_ids hands out the manager's own table (a caller's append changes it)
    ("ex04_block_allocator", "return list(self.tables.get(request_id, ()))", "return self.tables.get(request_id, [])"),
    # ex04: check_invariants compares ref counts only (C2: the free queue is never read against them)
    ("ex04_block_allocator", "if count != references[block_id] or (count == 0) != in_queue:",
     "if count != references[block_id]:"),
    # ex04: check_invariants compares the free queue only (C1: a held block's count is never checked)
    ("ex04_block_allocator", "if count != references[block_id] or (count == 0) != in_queue:",
     "if (count == 0) != in_queue:"),
    # ex04: check_invariants misses a block queued twice (C3)
    ("ex04_block_allocator", "            assert times == 1, f\"block {block_id} is in the free queue {times} times\"\n", "            pass\n"),
    # ex04: check_invariants never compares num_free_blocks with the free queue
    ("ex04_block_allocator", "        assert len(free) == self.pool.num_free_blocks, (\n", "        assert True, (\n"),
    # ex04: check_invariants raises without saying which block
    ("ex04_block_allocator", "                    f\"block {block_id}: ref count {count}, {references[block_id]} block-table \"\n",
     "                    \"the books disagree: ref count \"\n"),
    # ex07: the blocks of a failed step counted as considered (C1 says a failed step considers nothing)
    ("ex07_prefix_cache", "        self.planned = []\n",
     "        for request in self.planned:\n"
     "            table = self.tables.get(request.request_id)\n"
     "            if table:\n"
     "                full = min(request.num_computed_tokens // self.block_size, len(table))\n"
     "                self.num_committed[request.request_id] = max(self.num_committed.get(request.request_id, 0), full)\n"
     "        self.planned = []\n"),
    # ex07: a block hashed on its own tokens, not chained to its parent
    ("ex07_prefix_cache", "return digest((parent_hash, tuple(token_ids), extra_keys))", "return digest((tuple(token_ids), extra_keys))"),
    # ex07: the extra keys (cache_salt) ignored
    ("ex07_prefix_cache", "return digest((parent_hash, tuple(token_ids), extra_keys))", "return digest((parent_hash, tuple(token_ids)))"),
    # ex07: a trailing partial block hashed (and so registered)
    ("ex07_prefix_cache", "range(0, len(token_ids) - block_size + 1, block_size)", "range(0, len(token_ids), block_size)"),
    # ex07: the salt mixed into every block, so a chain continued from a parent hashes differently
    ("ex07_prefix_cache", "extra = (cache_salt,) if parent is None and cache_salt is not None else None",
     "extra = (cache_salt,) if cache_salt is not None else None"),
    # ex07: the salt forgotten
    ("ex07_prefix_cache", "extra = (cache_salt,) if parent is None and cache_salt is not None else None", "extra = None"),
    # ex07: the chain restarted instead of continued from the given parent
    ("ex07_prefix_cache", "    hashes: list[int] = []\n    for start", "    hashes: list[int] = []\n    parent = None\n    for start"),
    # ex07: a hit covering the whole prompt (nothing left to compute, no logits)
    ("ex07_prefix_cache", "max_hit_blocks = (request.num_tokens - 1) // bs", "max_hit_blocks = request.num_tokens // bs"),
    # ex07: fork without taking references
    ("ex07_prefix_cache", "        self.pool.touch(blocks)\n        self.tables[child.request_id]", "        self.tables[child.request_id]"),
    # ex07: the child's table is the parent's list itself (a copy on write replaces both)
    ("ex07_prefix_cache", "self.tables[child.request_id] = list(blocks)", "self.tables[child.request_id] = blocks"),
    # ex07: copying a block nobody else holds
    ("ex07_prefix_cache", "if pool.ref_count(table[i]) > 1]", "if pool.ref_count(table[i]) >= 1]"),
    # ex07: the written range one block too long
    ("ex07_prefix_cache", "last = min((end - 1) // bs, len(table) - 1)", "last = min(end // bs, len(table) - 1)"),
    # ex07: full shared blocks before the written range copied too
    ("ex07_prefix_cache", "for i in range(first // bs, last + 1)", "for i in range(0, last + 1)"),
    # ex07: the copy keeps its reference to the shared block
    ("ex07_prefix_cache", "            pool.free([table[i]])  # ours goes; the other holders keep theirs\n", ""),
    # ex07: the copy recorded backwards
    ("ex07_prefix_cache", "self.pending_copies.append((table[i], copy))", "self.pending_copies.append((copy, table[i]))"),
    # ex07: a free hit not counted as taken when checking that the request fits
    ("ex07_prefix_cache", "free_hits = sum(1 for block in hits if pool.ref_count(block) == 0)", "free_hits = 0"),
    # ex07: new blocks taken before the references on the hits (a free hit handed out as a new block)
    ("ex07_prefix_cache",
     "        if hits:\n            pool.touch(hits)  # before taking new blocks: a free hit must not be handed out as one\n"
     "            table.extend(hits)\n            self.num_committed[rid] = len(hits)\n        fresh = pool.allocate(len(to_copy) + need)\n",
     "        fresh = pool.allocate(len(to_copy) + need)\n        if hits:\n            pool.touch(hits)\n"
     "            table.extend(hits)\n            self.num_committed[rid] = len(hits)\n"),
    # ex07: a block handed out again keeps the hash of what it held (a stale hit)
    ("ex07_prefix_cache", "            evicted = self.hash_of.pop(block, None)\n            if evicted is not None:\n"
     "                del self.cached[evicted]\n", "            pass\n"),
    # ex07: freed head first (the shared prefix evicted before the private tail)
    ("ex07_prefix_cache", "self.pool.free(reversed(table))", "self.pool.free(table)"),
    # ex07: blocks registered when allocated, before the step that writes them has run
    ("ex07_prefix_cache", "            self.planned.append(request)\n        return list(table)",
     "            self.planned.append(request)\n            added = len(hits) * bs + num_new_tokens\n"
     "            request.num_computed_tokens += added\n            self.commit_written_blocks()\n"
     "            request.num_computed_tokens -= added\n        return list(table)"),
    # ex07: check_invariants that checks nothing
    ("ex07_prefix_cache", "        references = Counter(b for table", "        return\n        references = Counter(b for table"),
    # ex07: check_invariants never looks at who holds blocks
    ("ex07_prefix_cache", "            extra = {rid for rid, table in self.tables.items() if table} - set(live_request_ids)",
     "            extra = set()"),
    # ex07: cached_block_ids that reports nothing
    ("ex07_prefix_cache", "return set(self.hash_of)", "return set()"),
    # ex07: a failed step's plan kept, so the next commit registers blocks nobody wrote
    ("ex07_prefix_cache", "        # BEGIN SOLUTION\n        self.planned = []\n        # END SOLUTION",
     "        # BEGIN SOLUTION\n        pass\n        # END SOLUTION"),
    # ex07: a freed request's pending copies kept (a copy into a block it no longer holds)
    ("ex07_prefix_cache", "        if self.pending_copies:\n            mine = set(table)\n", "        if False:\n            mine = set(table)\n"),
    # ex07: the lookahead slots counted as written (a shared block copied for room only)
    ("ex07_prefix_cache", "last = min((end - 1) // bs, len(table) - 1)", "last = min((end + num_lookahead_tokens - 1) // bs, len(table) - 1)"),
    # ex07: every commit registers from block 0 (a block skipped under C2 registered later)
    ("ex07_prefix_cache", "start = self.num_committed.get(rid, 0)", "start = 0"),
    # ex08: the step's blocks never committed (no prefix hit, with a scheduler that leaves it to the core)
    ("ex08_engine_step", _EX08_COMMIT, ""),
    # ex08: committed before the executor ran (a step that then fails leaves unwritten blocks shared)
    ("ex08_engine_step", _EX08_RUN_TO_COMMIT,
     "        kv.commit_written_blocks()\n" + _EX08_RUN_TO_COMMIT.replace(_EX08_COMMIT, "")),
    # ex08: committed after the update (requests that finished in the step freed their blocks first)
    ("ex08_engine_step", _EX08_COMMIT_TO_UPDATE,
     _EX08_COMMIT_TO_UPDATE.replace(_EX08_COMMIT, "") + "        kv.commit_written_blocks()\n"),
    # ex08: committed after the failed rows gave their blocks back (their written blocks never cached)
    ("ex08_engine_step", _EX08_COMMIT_TO_FAIL_ROWS,
     _EX08_COMMIT_TO_FAIL_ROWS.replace(_EX08_COMMIT, "") + "        kv.commit_written_blocks()\n"),
    # ex08: a failed step's blocks kept for the prefix cache (never discarded)
    ("ex08_engine_step", "            kv.discard_unwritten_blocks()  # nobody knows what the step wrote\n", ""),
    # ex08: a failed step fails every request the scheduler holds, not only the plan's
    ("ex08_engine_step", _EX08_FAIL_PLAN,
     "            deltas = self.fail_requests(dict.fromkeys(list(sched.requests), message))\n"),
    # ex08: a failed step's message without the error's type; the failed step never recorded
    ("ex08_engine_step", 'message = f"{type(err).__name__}: {err}"', "message = str(err)"),
    ("ex08_engine_step", "            end = self.clock()\n            record(end)\n", "            end = self.clock()\n"),
    # ex08: Ctrl-C not cleaned up (only Exceptions caught), swallowed, or passed on before the cleanup
    ("ex08_engine_step", "        except BaseException as err:", "        except Exception as err:"),
    ("ex08_engine_step", _EX08_RERAISE, ""),
    ("ex08_engine_step", _EX08_FAIL_PLAN, _EX08_RERAISE + _EX08_FAIL_PLAN),
    # ex08: failed rows never ended; their tokens appended; one failed row fails the whole step
    ("ex08_engine_step", _EX08_FAIL_ROWS, "        deltas = []\n"),
    ("ex08_engine_step", "        tokens = {rid: token for rid, token in tokens.items() if rid not in failed}\n", ""),
    ("ex08_engine_step", _EX08_FAIL_ROWS,
     "        deltas = self.fail_requests({r.request_id: m for r in plan.requests for m in list(result.failed.values())[:1]})\n"),
    # ex08: n > 1: siblings never forked
    ("ex08_engine_step", "        for leader_id, kids in plan.forks.items():\n", "        for leader_id, kids in {}.items():\n"),
    # ex08: forked tokens counted for a sibling that got no seat
    ("ex08_engine_step", "                if kid.status is RequestStatus.RUNNING:  # seated: it shares the leader's prompt\n"
     "                    forked += leader.num_computed_tokens\n", "                forked += leader.num_computed_tokens\n"),
    # ex08: prefix-cache queries counted for every request at every step, not at its first
    ("ex08_engine_step", "            if req.first_scheduled_time is None:  # scheduled for the first time: from the cache\n",
     "            if True:\n"),
    # ex08: first-scheduled time stamped before the executor ran (a failed step computed nothing), or never
    ("ex08_engine_step", "        def record(end: float) -> None:\n",
     _EX08_STAMP_SCHEDULED + "\n        def record(end: float) -> None:\n"),
    ("ex08_engine_step", _EX08_STAMP_SCHEDULED, ""),
    # ex08: first-token times not stamped, or stamped at the step's start
    ("ex08_engine_step", "                req.first_token_time = end\n", "                pass\n"),
    ("ex08_engine_step", "                req.first_token_time = end\n", "                req.first_token_time = start\n"),
    # ex08: the requests that got tokens looked up after the update (one that finished at its first token is gone)
    ("ex08_engine_step", "        stepped = {rid: sched.requests[rid] for rid in tokens}\n" + _EX08_UPDATE,
     _EX08_UPDATE + "        stepped = {rid: sched.requests[rid] for rid in tokens if rid in sched.requests}\n"),
    # ex08: a forked sibling never first-scheduled
    ("ex08_engine_step", "                if req.first_scheduled_time is None:  # a sibling, forked in this step\n"
     "                    req.first_scheduled_time = start\n", ""),
    # ex08: max_tokens=1: recorded as finished before its first token is stamped (its TTFT is lost)
    ("ex08_engine_step", _EX08_FIRST_TOKENS, _EX08_ENDED + _EX08_FINISH + _EX08_FIRST_TOKENS),
    # ex08: finished requests not recorded; the end time read before the executor ran
    ("ex08_engine_step", _EX08_FINISH, ""),
    ("ex08_engine_step", _EX08_UPDATE, "        appended = sched.update_from_output(plan, tokens)\n        end = start\n"),
    # ex08: statistics recorded before the update (batch and blocks of requests about to finish)
    ("ex08_engine_step", _EX08_UPDATE, "        end = self.clock()\n        record(end)\n" + _EX08_UPDATE),
    # ex08: beam search's chooser ignored
    ("ex08_engine_step", "tokens = result.new_token_ids if choose_tokens is None else choose_tokens(plan, result)",
     "tokens = result.new_token_ids"),
    # ex08: the executor's log-probabilities dropped
    ("ex08_engine_step", _EX08_OUTPUT, "        return self.step_outputs(plan, start, end, deltas + appended)\n"),
    # ex08: a stalled engine not reported
    ("ex08_engine_step", "if not (plan.requests or plan.preempted or ended) and sched.has_unfinished_requests():",
     "if False:"),
    # ex08: the output's appended tokens, or its failed requests, left out
    ("ex08_engine_step", _EX08_OUTPUT, "        return self.step_outputs(plan, start, end, deltas, result)\n"),
    ("ex08_engine_step", _EX08_OUTPUT, "        return self.step_outputs(plan, start, end, appended, result)\n"),
    # ex09 (a): K or V forgotten; int4 stored as a byte; the pool counted in tokens, not blocks
    ("ex09_reasoning", "return 2 * model.num_layers", "return model.num_layers"),
    ("ex09_reasoning", "bits = DTYPE_BITS[model.kv_dtype]", "bits = max(DTYPE_BITS[model.kv_dtype], 8)"),
    ("ex09_reasoning", "return pool_blocks // blocks_per_sequence",
     "return int(kv_memory_bytes // (kv_bytes_per_token(model) * seq_len))"),
    # ex09 (b): designs that miss a target or break a rule
    # FCFS's queue (arrival first), or no tell between chat and reasoning: chat waits a minute
    ("ex09_reasoning", "return (request.priority, int(long), request.arrival_time)",
     "return (request.arrival_time, request.priority, int(long))"),
    ("ex09_reasoning", "return (request.priority, int(long), request.arrival_time)",
     "return (request.priority, 0, request.arrival_time)"),
    # reasoning first (the test inverted), or the prompt's length taken for the answer's
    ("ex09_reasoning", "return (request.priority, int(long), request.arrival_time)",
     "return (request.priority, 1 - int(long), request.arrival_time)"),
    ("ex09_reasoning", "long = max_tokens is None or max_tokens > 2048",
     "long = request.num_prompt_tokens > 2048"),
    # the client's priority ignored, or after the length
    ("ex09_reasoning", "return (request.priority, int(long), request.arrival_time)",
     "return (int(long), request.priority, request.arrival_time)"),
    # the victim: FCFS's newest (a chat request, then blocking the queue), the most important,
    # or found by sorting the scheduler's own list
    ("ex09_reasoning", "return max(running, key=self.waiting_key)", "return running[-1]"),
    ("ex09_reasoning", "return max(running, key=self.waiting_key)", "return min(running, key=self.waiting_key)"),
    ("ex09_reasoning", "return max(running, key=self.waiting_key)",
     "running.sort(key=self.waiting_key)\n        return running[-1]"),
    # chat told by its request id (a policy sees none), or by a budget line that chat crosses
    ("ex09_reasoning", "long = max_tokens is None or max_tokens > 2048",
     "long = not request.request_id.startswith('chat')"),
    ("ex09_reasoning", "long = max_tokens is None or max_tokens > 2048",
     "long = max_tokens is None or max_tokens > 512"),
    # no push-outs at all: chat waits for a chain to grow or finish
    ("ex09_reasoning", "return self.waiting_key(incoming)[:2] < self.waiting_key(victim)[:2]", "return False"),
    # push-outs both ways (thrashing), or up the priorities
    ("ex09_reasoning", "return self.waiting_key(incoming)[:2] < self.waiting_key(victim)[:2]", "return True"),
    ("ex09_reasoning", "return self.waiting_key(incoming)[:2] < self.waiting_key(victim)[:2]",
     "return self.waiting_key(incoming)[:2] <= self.waiting_key(victim)[:2]"),
    ("ex09_reasoning", "return self.waiting_key(incoming)[:2] < self.waiting_key(victim)[:2]",
     "return self.waiting_key(incoming)[1] < self.waiting_key(victim)[1]"),
]


def enclosing_names(source: str, index: int) -> list[str]:
    """The functions and classes of ``source`` whose body holds the character at ``index``,
    innermost first."""
    starts = [0, *itertools.accumulate(len(line) for line in source.splitlines(keepends=True))]
    spans = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = starts[node.lineno - 1] + node.col_offset
            last = starts[node.end_lineno - 1] + node.end_col_offset
            if first <= index < last:
                spans.append((last - first, node.name))
    return [name for _, name in sorted(spans)]


@pytest.mark.parametrize("name, old, new", MUTANTS, ids=[f"{m[0]}:{m[2][:30]}" for m in MUTANTS])
def test_checks_catch_a_wrong_answer(name, old, new, tmp_path):
    text = (ROOT / "solutions" / f"{name}.py").read_text()
    assert old in text, "the solution changed: update this mutant"
    path = tmp_path / f"{name}.py"
    path.write_text(text.replace(old, new, 1))
    module = load_path(path, name, "mutant")
    # stop at the first case that notices: the cases of the function the mutant changed first
    # (the others would pass it by), those of its class next, then the rest in the checks'
    # order -- any case may notice
    where = enclosing_names(text, text.index(old))

    def nearness(case) -> int:
        graded = case.func.split(".")
        return next((depth for depth, enclosing in enumerate(where) if enclosing == graded[-1]), len(where))

    cases = sorted(course.cases_for(name), key=nearness)
    assert any(not run_case(c, module).passed for c in cases), f"no case notices {old!r} -> {new!r}"


def _student_checkout(tmp_path, monkeypatch, solved: list[str]):
    """A fork as a student has it: fresh stubs, except the exercises in ``solved`` (the
    reference answers, as if the student wrote them); graded without MINIVLLM_SOLUTIONS."""
    (tmp_path / "solutions").mkdir()
    for name in NAMES:
        (tmp_path / "solutions" / f"{name}.py").write_text((ROOT / "solutions" / f"{name}.py").read_text())
    exgen.write_exercises(tmp_path)
    for name in solved:
        (tmp_path / "exercises" / f"{name}.py").write_text((ROOT / "solutions" / f"{name}.py").read_text())
    monkeypatch.setenv("MINIVLLM_COURSE_ROOT", str(tmp_path))
    monkeypatch.delenv("MINIVLLM_SOLUTIONS", raising=False)


def _case(name: str, title: str):
    return next(c for c in course.cases_for(name) if c.name == title)


@pytest.mark.parametrize("own_ex04", [False, True])
def test_ex07_on_the_reference_ex04_is_not_complete(tmp_path, monkeypatch, own_ex04):
    """A correct exercise 07 over the reference exercise 04 (the student's does not pass yet)
    says so and stays to do; over the student's own exercise 04 it passes."""
    _student_checkout(tmp_path, monkeypatch, ["ex07_prefix_cache"] + own_ex04 * ["ex04_block_allocator"])
    ex07 = course.load("ex07_prefix_cache")
    result = run_case(_case("ex07_prefix_cache", "built on your own exercise 04"), ex07)
    if own_ex04:
        assert result.passed, result.message
    else:
        assert result.status == TODO and "runs on the reference exercise 04" in result.message


def test_the_capstone_is_its_own_line_and_exercise_08_counts_its_own_cases(tmp_path, monkeypatch):
    """Exercise 08 done, nothing else: exercise 08 passes on its own cases, the capstone's line
    says which exercises it still needs, and in the capstone's table the step loop is yours."""
    from minivllm.course import capstone

    _student_checkout(tmp_path, monkeypatch, ["ex08_engine_step"])
    ex08 = course.load("ex08_engine_step")
    assert course.verdict(ex08).passed
    (line,) = capstone.capstone_report().results
    assert line.status == TODO and line.message.startswith("needs ex02, ex03, ex04, ex05, ex06, ex07 "), line.message
    table = capstone.assemble(ex08).table()
    assert any("step loop" in row and "yours" in row for row in table.splitlines()), table
    reports = course.grade()
    assert [r.exercise for r in reports][-1] == "capstone" and not reports[-1].passed


# --- scoreboard and command line ---------------------------------------------------------------------
def test_check_prints_a_scoreboard_and_raises(tmp_path, capsys):
    text = (ROOT / "solutions" / "ex01_static_waste.py").read_text()
    path = tmp_path / "ex01_static_waste.py"
    path.write_text(text.replace("acc.idle_rows += sum(longest_out - n for n in outs)", "acc.idle_rows += 0"))
    wrong = load_path(path, "ex01_static_waste", "exercises")
    with pytest.raises(course.CheckFailed, match="ex01_static_waste"):
        course.check(wrong)
    out = capsys.readouterr().out
    assert "✗ fail  account_static · the chapter's batch" in out and "'idle_rows': 207900" in out
    assert "hint:" in out
    assert "✓ pass  account_static · an empty trace" in out


def test_check_passes_quietly_on_the_reference(capsys):
    report = course.check(course.load("ex03", solutions=True))
    assert report.passed
    assert f"all {len(course.cases_for('ex03_chunked_prefill'))} checks of ex03_chunked_prefill passed" in capsys.readouterr().out


def test_cli_grade_and_make_exercises(capsys):
    """(The reference's full marks on every exercise: tests/course/test_grader_validation.py.)"""
    assert cli_main(["grade", "--solutions", "-q", "ex00", "1"]) == 0
    out = capsys.readouterr().out
    assert "✓ ex00_kv_memory" in out and "2/2 exercises complete" in out
    if course.use_solutions():
        assert cli_main(["course", "make-exercises", "--check"]) == 0


def test_cli_grade_reports_stubs_as_todo(tmp_path, monkeypatch, capsys):
    """Grading a fresh checkout: every exercise is todo and the exit code says so."""
    (tmp_path / "solutions").mkdir()
    for name in NAMES:
        (tmp_path / "solutions" / f"{name}.py").write_text((ROOT / "solutions" / f"{name}.py").read_text())
    exgen.write_exercises(tmp_path)
    monkeypatch.setenv("MINIVLLM_COURSE_ROOT", str(tmp_path))
    monkeypatch.delenv("MINIVLLM_SOLUTIONS", raising=False)
    assert cli_main(["grade", "ex00"]) == 1
    out = capsys.readouterr().out
    assert "· todo  kv_bytes_per_token" in out and "0/1 exercises complete" in out


def test_grade_survives_a_file_that_does_not_import(tmp_path, monkeypatch, capsys):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "exercises").mkdir()
    sol = (ROOT / "solutions" / "ex01_static_waste.py").read_text()
    (tmp_path / "solutions" / "ex01_static_waste.py").write_text(sol)
    (tmp_path / "exercises" / "ex01_static_waste.py").write_text("def broken(:\n")
    monkeypatch.setenv("MINIVLLM_COURSE_ROOT", str(tmp_path))
    monkeypatch.delenv("MINIVLLM_SOLUTIONS", raising=False)
    assert cli_main(["grade"]) == 1
    assert "the file does not import: SyntaxError" in capsys.readouterr().out


_EX01_BODY = "    # BEGIN SOLUTION\n    if batch_size < 1:"


def _course_with_ex01(tmp_path, first_line: str) -> Path:
    """A copy of the course holding exercise 01 alone, the student's file being the reference
    with ``first_line`` run first in ``account_static``, the function every case grades."""
    for folder in ("solutions", "exercises"):
        (tmp_path / folder).mkdir(parents=True)
    sol = (ROOT / "solutions" / "ex01_static_waste.py").read_text()
    assert _EX01_BODY in sol, "the solution changed: update _EX01_BODY"
    (tmp_path / "solutions" / "ex01_static_waste.py").write_text(sol)
    (tmp_path / "exercises" / "ex01_static_waste.py").write_text(
        sol.replace(_EX01_BODY, f"    {first_line}\n{_EX01_BODY}", 1))
    return tmp_path


def _environment(root: Path) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if k != "MINIVLLM_SOLUTIONS"}
    env["MINIVLLM_COURSE_ROOT"] = str(root)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def test_grade_exits_nonzero_when_the_student_code_raises_system_exit(tmp_path):
    """``raise SystemExit(0)`` in a graded function ends neither the grader nor its scoreboard:
    `minivllm grade`, run as a student runs it, prints every case as an error naming it and exits 1."""
    import subprocess

    root = _course_with_ex01(tmp_path, "raise SystemExit(0)")
    done = subprocess.run([sys.executable, "-m", "minivllm.cli", "grade", "ex01"], env=_environment(root),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    n = len(course.cases_for("ex01_static_waste"))
    assert done.stdout.count("! error account_static") == n, done.stdout
    assert "SystemExit(0) raised (at exercises/ex01_static_waste.py:" in done.stdout
    assert "0/1 exercises complete, 0/" in done.stdout


@pytest.mark.parametrize("raised", ["KeyboardInterrupt('mine')", "GeneratorExit()", "SystemExit(3)"])
def test_a_case_whose_code_ends_the_process_is_an_error_and_grading_goes_on(tmp_path, monkeypatch, raised):
    root = _course_with_ex01(tmp_path, f"raise {raised}")
    monkeypatch.setenv("MINIVLLM_COURSE_ROOT", str(root))
    monkeypatch.delenv("MINIVLLM_SOLUTIONS", raising=False)
    (report,) = course.grade(["ex01"])
    assert report.results and all(r.status == "error" for r in report.results)
    assert report.results[0].message.startswith(f"{raised.split('(')[0]}(")
    with pytest.raises(AssertionError, match=r"\[error\] account_static"):
        course.require(report.results[0].case, course.load("ex01"))


def test_a_file_that_exits_as_it_imports_is_reported(tmp_path, monkeypatch, capsys):
    root = _course_with_ex01(tmp_path, "pass")
    path = root / "exercises" / "ex01_static_waste.py"
    path.write_text(path.read_text() + "\nraise SystemExit(0)\n")
    monkeypatch.setenv("MINIVLLM_COURSE_ROOT", str(root))
    monkeypatch.delenv("MINIVLLM_SOLUTIONS", raising=False)
    assert cli_main(["grade", "ex01"]) == 1
    assert "the file does not import: SystemExit: 0" in capsys.readouterr().out


def test_a_ctrl_c_the_user_presses_still_stops_the_grader(tmp_path, monkeypatch):
    """What tells the two apart: the SIGINT the grader watches for while the code runs."""
    root = _course_with_ex01(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGINT)")
    monkeypatch.setenv("MINIVLLM_COURSE_ROOT", str(root))
    monkeypatch.delenv("MINIVLLM_SOLUTIONS", raising=False)
    with pytest.raises(KeyboardInterrupt):
        course.grade(["ex01"])
    root = _course_with_ex01(tmp_path / "again", "raise KeyboardInterrupt")
    monkeypatch.setenv("MINIVLLM_COURSE_ROOT", str(root))
    assert not course.grade(["ex01"])[0].passed  # the watch was reset: the code's own is an error again


def test_pytest_fails_such_a_case_and_goes_on(tmp_path):
    """Under pytest too (tests/exercises/conftest.py): a KeyboardInterrupt the student's code
    raises fails its tests, and the session runs to the end instead of stopping."""
    import subprocess

    root = _course_with_ex01(tmp_path, "raise KeyboardInterrupt")
    tests = ROOT / "tests" / "exercises"
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", str(tests / "test_cases.py"), str(tests / "test_ex01_static_waste.py")],
                          env=_environment(root), capture_output=True, text=True, timeout=300, cwd=ROOT)
    n = len(course.cases_for("ex01_static_waste")) + 2
    assert done.returncode == 1, (done.returncode, done.stdout[-3000:], done.stderr[-3000:])
    assert f"{n} failed" in done.stdout, done.stdout[-3000:]
    assert "KeyboardInterrupt() raised (at exercises/ex01_static_waste.py:" in done.stdout


def test_working_falls_back_to_the_reference_with_a_notice(capsys):
    stub = course.load("ex00_kv_memory", solutions=False)
    assert course.working(stub).__course_source__ == "solutions"
    assert "does not pass its checks yet" in capsys.readouterr().out
    ref = course.load("ex00_kv_memory", solutions=True)
    course.check(ref, verbose=False)
    assert course.working(ref) is ref


def test_working_by_name_gives_its_notice_once(capsys, monkeypatch):
    """An exercise that loads its base by name (ex03 loads ex02) says once that the base falls
    back, not at every load; the notebook's ``course.working(ex)`` says it every time."""
    monkeypatch.delenv("MINIVLLM_SOLUTIONS", raising=False)  # the student's file, a stub here
    if course.verdict(course.load("ex00_kv_memory")).passed:
        pytest.skip("exercises/ex00_kv_memory.py passes its checks here")
    course.working("ex00_kv_memory")
    capsys.readouterr()
    course.working("ex00_kv_memory")
    assert "does not pass" not in capsys.readouterr().out
    course.working(course.load("ex00_kv_memory"))
    assert "does not pass its checks yet" in capsys.readouterr().out


# --- the machinery behind the plug-in exercises ---------------------------------------------------
def test_protocol_only_kv_refuses_what_the_protocol_does_not_offer():
    from minivllm.core.kv_cache_manager import KVCacheManager
    from minivllm.course.reference import ProtocolOnlyKV

    kv = ProtocolOnlyKV(KVCacheManager(8, 16, enable_caching=False))
    assert kv.num_free_blocks == 8 and kv.block_size == 16
    with pytest.raises(AttributeError, match="'block_pool' is not part of the KVCacheManager protocol"):
        kv.block_pool  # noqa: B018
    with pytest.raises(AttributeError, match="must not change"):
        kv.num_blocks = 4


def test_a_scheduler_that_reaches_past_the_protocol_fails_its_check(tmp_path):
    text = (ROOT / "solutions" / "ex02_continuous.py").read_text()
    old = "block_ids = self.kv.allocate_slots(req, 1)"
    assert old in text
    path = tmp_path / "ex02_continuous.py"
    path.write_text(text.replace(old, "block_ids = self.kv.allocate_slots(req, 1) if self.kv.block_pool else None"))
    report = run_cases("ex02_continuous", load_path(path, "ex02_continuous", "mutant"),
                       course.cases_for("ex02_continuous"), "mutant")
    assert not report.passed
    assert any("not part of the KVCacheManager protocol" in r.message for r in report.results)


def test_ex03_extends_the_working_exercise_02(capsys):
    """ChunkedScheduler subclasses the ContinuousScheduler of course.working("ex02_continuous"):
    the student's own once it passes, the reference (with a notice) until then."""
    ex03 = course.load("ex03_chunked_prefill", solutions=True)
    base = ex03.ChunkedScheduler.__mro__[1]
    assert base.__name__ == "ContinuousScheduler" and base is ex03.ContinuousScheduler
    assert "update_from_output" in vars(base) and "update_from_output" not in vars(ex03.ChunkedScheduler)
    assert sys.modules[base.__module__].__exercise__ == "ex02_continuous"


def test_replay_comparison_reports_the_state_before_the_step():
    from minivllm.core.scheduler import Scheduler
    from minivllm.course.harness import StepMismatch, TraceRequest
    from minivllm.course.reference import compare_with_reference

    class LeakyScheduler(Scheduler):  # never frees a finished request's blocks
        def _release(self, req):
            self.requests.pop(req.request_id, None)

    trace = [TraceRequest("a", 20, 2), TraceRequest("b", 3, 4, 1)]
    with pytest.raises(StepMismatch) as err:
        compare_with_reference(LeakyScheduler, trace, max_num_seqs=2, max_num_batched_tokens=32, label="leak")
    text = str(err.value)
    assert "leak: max_num_seqs=2, max_num_batched_tokens=32" in text
    assert "KV blocks in use after the step" in text and "before step 1: running [('a', 1)]" in text
    assert text.endswith("(the state before that step is shown above)")


def test_the_ex03_scheduler_runs_over_another_kv_cache_manager():
    """What notebook 08 does: the student's scheduler and a KV cache manager written elsewhere,
    both plugged into one LLM, give minivllm's own greedy tokens."""
    from support import FreeListKV

    from minivllm import LLM, SamplingParams

    ex = course.load("ex03_chunked_prefill", solutions=True)
    prompts = ["Once upon a time", "The little fox lived in a den at the edge of the forest", "Tom went to"]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    args = dict(max_model_len=96, max_num_batched_tokens=16, enable_prefix_caching=False, dtype="float32")
    mine = LLM(scheduler=ex.ChunkedScheduler, kv_cache=FreeListKV(num_blocks=6, block_size=16), debug_checks=True, **args)
    ref = LLM(num_kv_blocks=6, **args)
    got = [o.outputs[0].token_ids for o in mine.generate(prompts, params, use_tqdm=False)]
    assert got == [o.outputs[0].token_ids for o in ref.generate(prompts, params, use_tqdm=False)]
    assert sum(s.num_preemptions for s in mine.stats().steps) > 0  # the small pool made it preempt


def test_exercise_08_and_its_notebook_name_the_engine_core_only_after_the_check():
    """minivllm's ``EngineCore`` (``minivllm/core/engine_core.py``) is exercise 08's answer: the
    stub imports its parts from ``minivllm.course.engine_core_base``, and notebook 08 names the
    file (in a cell or a stored output) only after its check cell."""
    import json

    names = ("minivllm/core/engine_core.py", "minivllm.core.engine_core")
    stub = exgen.make_exercise((ROOT / "solutions" / "ex08_engine_step.py").read_text(), "ex08_engine_step")
    assert not [n for n in names if n in stub]
    cells = json.loads((ROOT / "notebooks" / "08_serving_loop.ipynb").read_text())["cells"]
    check = next(i for i, c in enumerate(cells) if "course.check(ex)" in "".join(c["source"]))
    early = [i for i, c in enumerate(cells[:check])
             if any(n in "".join(c["source"]) + json.dumps(c.get("outputs", [])) for n in names)]
    assert not early, f"notebook 08 names minivllm's engine core before its check (cell {check}): cells {early}"
