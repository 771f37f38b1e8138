"""``benchmarks/vs_vllm.py``: the minivllm-vs-vLLM comparison, without vLLM installed.

The real vLLM lives in its own virtualenv that CI does not have, so the plumbing is tested
with a stand-in ``vllm`` package written to a temporary directory: its ``LLM`` serves the
requests with minivllm and, when asked, changes one output token. The benchmark cannot tell;
it starts ``vllm_driver.py`` with that interpreter, sends the trace as JSON, reads the outputs
back and compares them, so every step between the two engines runs for real.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import minivllm

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "vs_vllm.py"
DRIVER = ROOT / "benchmarks" / "vllm_driver.py"


def load_benchmark():
    spec = importlib.util.spec_from_file_location("vs_vllm", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


vs = load_benchmark()

# The stand-in: vLLM's names and call shapes as vllm_driver.py uses them, minivllm underneath.
# FAKE_VLLM_FLIP="i:p" adds 1 to token p of request i's output (to check the comparison).
FAKE_VLLM = {
    "vllm/__init__.py": """
        import os
        import minivllm

        __version__ = "0.0.stand-in"

        def SamplingParams(temperature, max_tokens, ignore_eos):
            return minivllm.SamplingParams(temperature=temperature, max_tokens=max_tokens,
                                           ignore_eos=ignore_eos)

        class LLM:
            def __init__(self, model, dtype, enforce_eager, max_model_len, max_num_seqs):
                self.llm = minivllm.LLM(model, dtype=dtype, max_model_len=max_model_len,
                                        max_num_seqs=max_num_seqs)

            def collective_rpc(self, fn):
                return [fn(None)]

            def generate(self, prompts, params, use_tqdm):
                ids = [p["prompt_token_ids"] for p in prompts]
                outs = self.llm.generate(ids, params, use_tqdm=use_tqdm)
                flip = os.environ.get("FAKE_VLLM_FLIP")
                if flip and len(outs) > 2:  # not in the warm-up
                    i, p = map(int, flip.split(":"))
                    outs[i].outputs[0].token_ids[p] += 1
                return outs
    """,
    "vllm/inputs.py": """
        def TokensPrompt(prompt_token_ids):
            return {"prompt_token_ids": prompt_token_ids}
    """,
}
BROKEN_VLLM = {"vllm/__init__.py": "raise ImportError('libtorchvision.so: undefined symbol')\n"}


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def run_script(*args: str, pythonpath: Path | None = None, **env: str):
    paths = [str(pythonpath)] if pythonpath else []
    paths.append(str(ROOT))
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **env}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=300)


def test_without_vllm_python_it_says_how_to_get_vllm_and_exits_0(capsys):
    assert vs.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("SKIPPED: no --vllm-python given")
    assert "scripts/setup_vllm_venv.sh" in out


def test_when_vllm_does_not_import_it_names_the_error_and_exits_0(tmp_path, monkeypatch, capsys):
    fake = write_package(tmp_path, BROKEN_VLLM)
    monkeypatch.setenv("PYTHONPATH", str(fake))
    assert vs.main(["--vllm-python", sys.executable, "--quick"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"SKIPPED: vLLM cannot be imported with {sys.executable}")
    assert "libtorchvision.so: undefined symbol" in out


def test_quick_run_through_the_driver_counts_identical_outputs_and_finds_the_difference(tmp_path):
    fake = write_package(tmp_path, FAKE_VLLM)
    # one thread each: two engines' OpenMP pools on a 2-core CI machine would fight
    proc = run_script("--vllm-python", sys.executable, "--quick", "--threads", "1",
                      "--vllm-threads", "1", "--profile", pythonpath=fake, FAKE_VLLM_FLIP="3:1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert out.splitlines()[0] == (f"$ python benchmarks/vs_vllm.py --vllm-python {sys.executable}"
                                   " --quick --threads 1 --vllm-threads 1 --profile")
    rows = [line for line in out.splitlines() if line.startswith("| 1 | ")]
    assert len(rows) == 2, out
    assert rows[0].startswith("| 1 | minivllm ")
    assert "| 1 torch thread (--threads 1; torch's default " in rows[0]
    assert rows[1].startswith("| 1 | vLLM 0.0.stand-in")
    assert "| 1 torch thread on cores [" in rows[1]
    assert "(in-process engine, no OMP binding, OMP_NUM_THREADS=1)" in rows[1]
    assert f"identical: {vs.QUICK_REQUESTS - 1}/{vs.QUICK_REQUESTS}" in out
    assert "first difference: request 3 " in out and "output token 1: minivllm " in out
    ratio = float(out.split("minivllm / vLLM output throughput: ")[1].split("x")[0])
    assert ratio > 0
    profile = out.split("minivllm profile of the timed generate (")[1]
    assert re.search(r"attention \d+\.\d\d s \(\d+%\), linear layers \d+\.\d\d s", profile)
    assert len(re.findall(r"^ +\d+\.\d\d s +\d+ calls +\S", profile, re.MULTILINE)) == 8


def test_the_driver_never_imports_minivllm():
    tree = ast.parse(DRIVER.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert "minivllm" not in imported
    assert imported <= {"__future__", "json", "os", "sys", "time", "torch", "vllm"}, imported


def test_full_trace_fits_the_context_and_the_vocabulary_and_survives_json():
    vocab = minivllm.model.ModelConfig.from_file(minivllm.TINY_MODEL_DIR).vocab_size
    trace = vs.build_trace(128, seed=0, quick=False)
    request = vs.trace_request(trace, minivllm.TINY_MODEL_DIR, vocab, max_num_seqs=64)
    assert json.loads(json.dumps(request)) == request
    assert len(request["prompts"]) == len(request["max_tokens"]) == 128
    assert max(map(len, request["prompts"])) <= 400 and max(request["max_tokens"]) <= 400
    assert all(0 <= t < vocab for p in request["prompts"] for t in p)
    assert request["llm_args"]["max_model_len"] >= max(
        len(p) + n for p, n in zip(request["prompts"], request["max_tokens"], strict=True))
    # the same seed gives the same trace; another seed another one
    again = vs.trace_request(vs.build_trace(128, 0, False), minivllm.TINY_MODEL_DIR, vocab, 64)
    other = vs.trace_request(vs.build_trace(128, 1, False), minivllm.TINY_MODEL_DIR, vocab, 64)
    assert again == request and other["prompts"] != request["prompts"]


@pytest.mark.parametrize(
    ("ours", "theirs", "expected"),
    [
        ([[1, 2], [3, 4]], [[1, 2], [3, 4]], None),
        ([[1, 2], [3, 4]], [[1, 2], [3, 5]], (1, 1, 4, 5)),
        ([[1, 2], [9, 4]], [[1, 2], [3, 5]], (1, 0, 9, 3)),
        ([[1, 2, 3]], [[1, 2]], (0, 2, 3, None)),  # one output ended early
        ([[]], [[7]], (0, 0, None, 7)),
    ],
)
def test_first_mismatch(ours, theirs, expected):
    miss = vs.first_mismatch(ours, theirs)
    found = None if miss is None else (miss.index, miss.position, miss.ours, miss.theirs)
    assert found == expected
    identical = vs.count_identical(ours, theirs)
    assert identical == len(ours) - (expected is not None)


def test_outputs_of_different_traces_are_refused():
    with pytest.raises(ValueError, match="2 outputs against 1"):
        vs.first_mismatch([[1], [2]], [[1]])


@pytest.mark.parametrize(
    "flag", ["--num-requests", "--max-num-seqs", "--threads", "--busy-threads", "--repeats"])
def test_bad_counts_are_refused_naming_the_value(flag, capsys):
    with pytest.raises(SystemExit):
        vs.parse_args([flag, "0"])
    assert f"{flag} must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="CPU accounting reads /proc")
def test_busy_competitor_runs_inside_the_block_is_measured_and_is_gone_after():
    with vs.busy_cpu(1) as proc:
        assert proc is not None and proc.poll() is None
        meter = vs.CpuMeter(proc.pid)
        time.sleep(0.5)
        others, competitor = meter.stop()
    assert proc.returncode is not None
    # one thread can use at most one core (plus a tick of rounding); a running loop some of it
    assert 0.0 < competitor <= 1.1
    assert others >= 0.0
    with vs.busy_cpu(None) as nothing:
        assert nothing is None
    assert vs.CpuMeter(None).stop()[1] is None


def test_report_of_several_rounds_takes_the_best_of_each_engine():
    trace = vs.build_trace(0, seed=0, quick=True)
    request = vs.trace_request(trace, minivllm.TINY_MODEL_DIR, 100, max_num_seqs=4)
    outputs = [[5] * n for n in request["max_tokens"]]
    tokens = sum(request["max_tokens"])

    def run(engine: str, seconds: float, outs=outputs) -> vs.EngineRun:
        return vs.EngineRun(engine, "1 torch thread", 1.0, 0.1, seconds, outs, 0.5, 0.25, None)

    changed = [list(o) for o in outputs]
    changed[2][-1] = 6
    rounds = [(run("mini", 2.0), run("vllm", 1.0)), (run("mini", 1.0), run("vllm", 4.0, changed))]
    text = vs.report(trace, request, rounds, "none", ["--quick", "--repeats", "2"])
    assert text.count("| 1 | ") == 2 and text.count("| 2 | ") == 2
    # best minivllm round: 1.0 s; best vLLM round: 1.0 s, although they are different rounds
    assert f"minivllm {tokens / 1.0:.0f} output tok/s, vLLM {tokens / 1.0:.0f} output tok/s" in text
    assert "(best / best): 1.00x; per round: 0.50x, 4.00x" in text
    n = len(outputs)
    assert f"identical: {n}/{n}, {n - 1}/{n} (per round)" in text
    prompt_len, last = len(request["prompts"][2]), len(outputs[2]) - 1
    assert (f"first difference: request 2 (prompt {prompt_len} tokens), output token {last}: "
            "minivllm 5, vLLM 6") in text
    assert "| 0.25 | — |" in text  # others measured, no competitor


ORPHANING = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("vs_vllm", sys.argv[1])
vs = importlib.util.module_from_spec(spec)
sys.modules["vs_vllm"] = vs
spec.loader.exec_module(vs)
with vs.busy_cpu(1) as proc:
    print(proc.pid, flush=True)
    os._exit(0)  # killed mid-run: no finally block runs
"""


@pytest.mark.skipif(not Path("/proc").exists(), reason="looks the competitor up in /proc")
def test_busy_competitor_stops_when_the_benchmark_dies():
    proc = subprocess.run([sys.executable, "-c", ORPHANING, str(SCRIPT)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    pid = int(proc.stdout.strip())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return  # gone
        if state == "Z":
            return  # exited, waiting to be reaped by init
        time.sleep(0.2)
    os.kill(pid, 9)
    pytest.fail(f"the --busy competitor {pid} outlived its benchmark by 60 s")
