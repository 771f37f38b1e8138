"""``benchmarks/serving.py --quick`` runs against a server and reports every rate it sent."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

ROOT = Path(__file__).resolve().parents[2]


def load_benchmark():
    spec = importlib.util.spec_from_file_location("serving_benchmark", ROOT / "benchmarks" / "serving.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_percentile_matches_numpy():
    np = pytest.importorskip("numpy")
    bench = load_benchmark()
    values = [0.3, 0.1, 5.0, 2.0, 2.0, 0.7, 9.5]
    for q in (0, 50, 90, 99, 100):
        assert bench.percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert bench.percentile([], 50) != bench.percentile([], 50)  # NaN


def test_quick_run_reports_latency_and_throughput_per_rate(tmp_path, capsys):
    bench = load_benchmark()
    out_json, out_png = tmp_path / "serving.json", tmp_path / "serving.png"
    status = bench.main(["--quick", "--in-process", "--rates", "8", "inf", "--num-requests", "6",
                         "--json", str(out_json), "--plot", str(out_png)])
    assert status == 0, capsys.readouterr().out
    rows = json.loads(out_json.read_text())
    assert [r["rate"] for r in rows] == [8.0, "inf"]
    for r in rows:
        assert r["config"] == "continuous" and r["completed"] == r["sent"] == 6 and not r["errors"]
        assert 0 < r["ttft_p50_ms"] <= r["ttft_p99_ms"]
        # an answer streamed in one chunk has no inter-token interval (short answers on an
        # overloaded machine can all arrive so): none at all is reported as such, not as 0
        assert r["itl_p50_ms"] is None or 0 < r["itl_p50_ms"] <= r["itl_p99_ms"]
        assert r["output_throughput"] > r["request_throughput"] > 0
    assert any(r["itl_p50_ms"] is not None for r in rows), "no answer of either rate came in more than one chunk"
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert "| continuous | 8 | 6/6 |" in table and "| continuous | inf | 6/6 |" in table


# --- the mode that runs vLLM's own client (vllm.benchmarks.serve) ----------------------------------
VLLM_PYTHON = Path.home() / ".cache" / "minivllm" / "vllm-venv" / "bin" / "python"


def client_run(bench, tmp_path, rate):
    return bench.ClientRun(port=8123, rate=rate, num_prompts=200, input_len=128, output_len=128, seed=3,
                           result_dir=str(tmp_path), result_file="r.json")


def test_the_client_is_asked_for_the_random_dataset_at_the_rate_greedy_and_streamed(tmp_path):
    bench = load_benchmark()
    args = bench.client_args(client_run(bench, tmp_path, float("inf")), "/models/tiny")
    flags = dict(zip(args[::2], args[1::2], strict=False))
    for flag, value in {"--port": "8123", "--model": bench.SERVED_NAME, "--tokenizer": "/models/tiny",
                        "--dataset-name": "random", "--random-input-len": "128", "--random-output-len": "128",
                        "--num-prompts": "200", "--request-rate": "inf", "--seed": "3", "--temperature": "0",
                        "--metric-percentiles": "50,90,99", "--result-dir": str(tmp_path),
                        "--result-filename": "r.json"}.items():
        assert args[args.index(flag) + 1] == value, flag
    assert "--ignore-eos" in args and "--save-result" in args
    assert bench.client_args(client_run(bench, tmp_path, 8.0), "t")[args.index("--request-rate") + 1] == "8"
    assert flags["--backend"] == "openai" and flags["--endpoint"] == "/v1/completions"


def client_json(throughput: float, ttft: float) -> dict:
    """A result in the shape vllm.benchmarks.serve --save-result writes (vLLM 0.32)."""
    out = {"completed": 200, "failed": 0, "duration": 6.3, "output_throughput": throughput,
           "request_throughput": throughput / 128, "total_output_tokens": 25600}
    for metric, base in (("ttft", ttft), ("tpot", 25.0), ("itl", 19.0), ("e2el", 4400.0)):
        for q, f in ((50, 1.0), (90, 2.0), (99, 3.0)):
            out[f"p{q}_{metric}_ms"] = base * f
        out[f"median_{metric}_ms"] = base
    return out


def test_results_are_parsed_and_set_side_by_side(capsys):
    bench = load_benchmark()
    inf = float("inf")
    ours = bench.parse_client_result(client_json(5000.0, 800.0), "minivllm", inf)
    theirs = bench.parse_client_result(client_json(4000.0, 900.0), "vllm", inf)
    assert ours.output_throughput == 5000.0 and ours.ttft == {50: 800.0, 90: 1600.0, 99: 2400.0}
    assert ours.tpot[50] == 25.0 and ours.itl[99] == 57.0 and ours.e2el[90] == 8800.0
    slow = bench.parse_client_result(client_json(1000.0, 20.0), "minivllm", 8.0)
    slow_vllm = bench.parse_client_result(client_json(2000.0, 30.0), "vllm", 8.0)
    bench.print_side_by_side([[ours, theirs, slow, slow_vllm]])
    out = capsys.readouterr().out
    assert "| inf | 1 | minivllm | 200 | 5000 | 800 / 2400 | 25.0 / 75.0 |" in out
    assert "round 1, minivllm / vLLM output tok/s: inf: 1.25x, 8: 0.50x" in out
    with pytest.raises(KeyError, match="p50_ttft_ms"):
        bench.parse_client_result({"completed": 1, "duration": 1, "output_throughput": 1,
                                   "request_throughput": 1}, "x", inf)


def test_both_servers_serve_the_same_model_under_one_name():
    bench = load_benchmark()
    vllm = bench.vllm_serve_command("/venv/python", "/models/tiny", 9000, ["--max-num-seqs", "64"])
    ours = bench.minivllm_serve_command(9001, ["--max-num-seqs", "64"])
    assert vllm[:3] == ["/venv/python", "-m", "vllm.entrypoints.openai.api_server"]
    for cmd in (vllm, ours):
        assert cmd[cmd.index("--served-model-name") + 1] == bench.SERVED_NAME
        assert cmd[-2:] == ["--max-num-seqs", "64"]
    assert vllm[vllm.index("--dtype") + 1] == "float32" and "--enforce-eager" in vllm
    env = bench.vllm_env()
    assert "TRITON_INTERPRET" not in env and env["HF_HUB_OFFLINE"] == "1"


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="vLLM's venv (scripts/setup_vllm_venv.sh) is not installed")
def test_vllms_own_parser_accepts_the_arguments(tmp_path):
    """The arguments go through vllm.benchmarks.serve.add_cli_args itself (no request is sent)."""
    import subprocess

    bench = load_benchmark()
    args = bench.client_args(client_run(bench, tmp_path, 16.0), str(ROOT / "minivllm" / "tiny_model"))
    check = ("import argparse, sys; from vllm.benchmarks.serve import add_cli_args; p = argparse.ArgumentParser(); "
             "add_cli_args(p); a = p.parse_args(sys.argv[1:]); "
             "print(a.dataset_name, a.random_input_len, a.request_rate, a.ignore_eos, a.save_result)")
    done = subprocess.run([str(VLLM_PYTHON), "-c", check, *args], capture_output=True, text=True,
                          env=bench.vllm_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-5:] == ["random", "128", "16.0", "True", "True"]
