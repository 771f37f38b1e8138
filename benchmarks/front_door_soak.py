"""``minivllm serve`` from outside, beside ``soak.py``: a connection flood, client hang-ups, a stalled core.

Each scenario starts ``minivllm serve`` (the tiny model, its engine core in a process of its own)
in a subprocess on loopback, its log to a file, and measures what a client and an operator see:

* ``flood``: ``--connections`` half-open connections (``socket.create_connection`` and half a
  request line each, held open) from ``--procs`` client processes over ``--seconds``, while a
  good 4-token request is sent every ``--every`` seconds; reports each good request's status
  and latency, the server log's size, the server's memory before and after, and its shed
  counters. ``--nofile N`` starts the server with its open-file limit at N (soft and hard, so
  that raising the soft limit at start cannot help; ``--soft-only`` sets only the soft one).
* ``hangups``: ``--count`` non-streaming requests whose client gives up after 0.3 s, as many
  streams closed after their first chunk; reports the log lines they cost (tracebacks, "never
  retrieved"), the aborts counted, and whether the core ended idle.
* ``stall``: four requests pending, then the core is stopped (SIGSTOP) for ``--stop-seconds``
  and resumed; reports ``/health`` over time (first 503 and its reason, first 200 after the
  resume), the gauges during the stall, and whether all four finished. Then SIGKILL: the gauges.

    python benchmarks/front_door_soak.py flood --connections 700 --nofile 512
    python benchmarks/front_door_soak.py flood --connections 20000 --procs 2 --seconds 20
    python benchmarks/front_door_soak.py hangups --count 240
    python benchmarks/front_door_soak.py stall --stop-seconds 10

``--repo DIR`` serves another checkout of minivllm (to measure the before). The suite runs small
versions of each (``tests/entrypoints/test_serve_flood.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
MODEL = "minivllm-tiny"
GOOD = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _limit_files(soft: int | None, hard: int | None):
    def apply() -> None:
        import resource

        cur_soft, cur_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        new_hard = cur_hard if hard is None else hard
        resource.setrlimit(resource.RLIMIT_NOFILE, (cur_soft if soft is None else soft, new_hard))

    return apply


@contextlib.contextmanager
def serve(*args: str, nofile: int | None = None, soft_only: bool = False, repo: Path = REPO,
          log_path: Path | None = None):
    """``minivllm serve`` in a subprocess: yields ``(process, url, log path)`` once healthy."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = log_path or Path(tempfile.mkstemp(prefix="minivllm-serve-", suffix=".log")[1])
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    preexec = None if nofile is None else _limit_files(nofile, None if soft_only else nofile)
    proc = subprocess.Popen(
        [sys.executable, "-m", "minivllm.cli", "serve", "--port", str(port), "--max-num-seqs", "16",
         "--log-level", "warning", *args],
        cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=preexec,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited ({proc.returncode}): {log_path.read_text()[-2000:]}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError("the server did not start")
            time.sleep(0.2)
        yield proc, url, log_path
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        log.close()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def metrics(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def good_request(url: str, timeout: float = 8.0) -> tuple[int | str, float]:
    start = time.monotonic()
    try:
        status = httpx.post(url + "/v1/completions", json=GOOD, timeout=timeout).status_code
    except httpx.HTTPError as error:
        status = type(error).__name__
    return status, time.monotonic() - start


# --- the flood --------------------------------------------------------------------------------------
def _flooder(host: str, port: int, n: int, seconds: float, hold: float, counts) -> None:
    """Open ``n`` half-open connections over ``seconds``, hold them ``hold`` s more."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    socks, failed = [], 0
    start = time.monotonic()
    for i in range(n):
        try:
            s = socket.create_connection((host, port), timeout=2)
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")  # half a request: no end of headers
            socks.append(s)
        except OSError:
            failed += 1
        lag = start + seconds * (i + 1) / n - time.monotonic()
        if lag > 0:
            time.sleep(lag)
    counts.put((len(socks), failed))
    time.sleep(hold)
    for s in socks:
        s.close()


def flood(url: str, connections: int, procs: int, seconds: float, every: float, hold: float,
          proc: subprocess.Popen, log_path: Path) -> dict:
    host, port = url.removeprefix("http://").split(":")
    good_request(url)  # warm
    rss_before = rss_mb(proc.pid)
    counts = multiprocessing.Queue()
    workers = [multiprocessing.Process(target=_flooder, args=(host, int(port), connections // procs, seconds,
                                                               hold, counts)) for _ in range(procs)]
    for w in workers:
        w.start()
    goods = []
    start = time.monotonic()
    while time.monotonic() - start < seconds + hold * 0.5:
        time.sleep(every)
        goods.append(good_request(url))
    opened = [counts.get(timeout=60) for _ in workers]
    for w in workers:
        w.join(60)
    time.sleep(1.0)
    after = metrics(url)
    return {
        "connections": connections, "client_processes": procs, "seconds": seconds,
        "opened": sum(o for o, _ in opened), "failed_to_open": sum(f for _, f in opened),
        "good": [{"status": s, "seconds": round(t, 3)} for s, t in goods],
        "good_ok": sum(s == 200 for s, _ in goods), "good_max_s": round(max(t for _, t in goods), 3),
        "log_bytes": log_path.stat().st_size,
        "log_accept_lines": sum("accept" in line for line in log_path.read_text(errors="replace").splitlines()),
        "rss_mb_before": round(rss_before, 1), "rss_mb_after": round(rss_mb(proc.pid), 1),
        "shed": {k.split('"')[1]: v for k, v in after.items() if k.startswith("minivllm_http_connections_shed")},
        "accept_errors": after.get("minivllm_http_accept_errors_total"),
    }


# --- hang-ups -----------------------------------------------------------------------------------------
def hangups(url: str, count: int, log_path: Path) -> dict:
    long = {"model": MODEL, "prompt": "The little fox", "max_tokens": 1500, "ignore_eos": True}
    before = metrics(url).get('minivllm_request_success_total{finished_reason="abort"}', 0.0)
    lines_before = len(log_path.read_text(errors="replace").splitlines())
    for _ in range(count):
        with contextlib.suppress(httpx.ReadTimeout):
            httpx.post(url + "/v1/completions", json=long, timeout=0.3)
        with httpx.stream("POST", url + "/v1/completions", json={**long, "stream": True}, timeout=30) as resp:
            next(resp.iter_lines())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = metrics(url)
        if m.get("minivllm_num_requests_running", 1) == 0 and m.get("minivllm_kv_cache_usage_ratio", 1) == 0:
            break
        time.sleep(0.1)
    text = log_path.read_text(errors="replace").splitlines()[lines_before:]
    m = metrics(url)
    return {
        "non_streaming_hangups": count, "streaming_hangups": count, "log_lines": len(text),
        "tracebacks": sum("Traceback" in line for line in text),
        "never_retrieved": sum("never retrieved" in line for line in text),
        "aborts_counted": m.get('minivllm_request_success_total{finished_reason="abort"}', 0.0) - before,
        "running_after": m.get("minivllm_num_requests_running"), "kv_after": m.get("minivllm_kv_cache_usage_ratio"),
    }


# --- a stalled core, then a dead one ----------------------------------------------------------------
def core_pid(server_pid: int) -> int:
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == server_pid:
                    return int(p.name)
    raise RuntimeError("no engine core process found")


def stall(url: str, server_pid: int, stop_seconds: float, pending: int = 4) -> dict:
    core = core_pid(server_pid)
    results: list = []
    body = {"model": MODEL, "prompt": "Mia had a red ball", "max_tokens": 64, "ignore_eos": True}
    os.kill(core, signal.SIGSTOP)
    t0 = time.monotonic()
    threads = [threading.Thread(target=lambda: results.append(
        httpx.post(url + "/v1/completions", json=body, timeout=stop_seconds + 60).status_code)) for _ in range(pending)]
    for t in threads:
        t.start()
    timeline, during = [], None
    while time.monotonic() - t0 < stop_seconds:
        r = httpx.get(url + "/health", timeout=5)
        timeline.append((round(time.monotonic() - t0, 2), r.status_code,
                         r.json()["error"]["message"] if r.status_code != 200 else ""))
        if r.status_code != 200 and during is None:
            during = metrics(url)
        time.sleep(0.25)
    os.kill(core, signal.SIGCONT)
    resumed = time.monotonic()
    while httpx.get(url + "/health", timeout=5).status_code != 200:
        time.sleep(0.05)
    back = time.monotonic() - resumed
    for t in threads:
        t.join(60)
    first_503 = next(((t, msg) for t, code, msg in timeline if code != 200), (None, ""))
    os.kill(core, signal.SIGKILL)
    time.sleep(1.0)
    dead = metrics(url)
    keys = ("minivllm_num_requests_running", "minivllm_num_requests_waiting", "minivllm_kv_cache_usage_ratio",
            "minivllm_num_requests_in_flight", "minivllm_engine_core_up", "minivllm_engine_core_silent_seconds")
    return {
        "stop_seconds": stop_seconds, "pending": pending, "finished_200": sum(s == 200 for s in results),
        "health_polls": len(timeline), "health_200_while_stopped": sum(code == 200 for _, code, _ in timeline),
        "first_503_after_s": first_503[0], "reason": first_503[1], "health_200_again_after_resume_s": round(back, 3),
        "gauges_during_stall": {k: during.get(k) for k in keys} if during else None,
        "health_after_kill": httpx.get(url + "/health", timeout=5).status_code,
        "gauges_after_kill": {k: dead.get(k) for k in keys},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=["flood", "hangups", "stall"])
    p.add_argument("--connections", type=int, default=700)
    p.add_argument("--procs", type=int, default=1)
    p.add_argument("--seconds", type=float, default=5.0, help="flood: time to open the connections")
    p.add_argument("--hold", type=float, default=4.0, help="flood: seconds to hold them open afterwards")
    p.add_argument("--every", type=float, default=1.0, help="flood: seconds between good requests")
    p.add_argument("--nofile", type=int, default=None, help="flood: the server's open-file limit")
    p.add_argument("--soft-only", action="store_true", help="flood: --nofile sets only the soft limit")
    p.add_argument("--count", type=int, default=20, help="hangups: of each kind")
    p.add_argument("--stop-seconds", type=float, default=10.0)
    p.add_argument("--repo", type=Path, default=REPO, help="the minivllm checkout to serve")
    p.add_argument("serve_args", nargs="*", help="more arguments for minivllm serve (after --)")
    args = p.parse_args(argv)
    with serve(*args.serve_args, nofile=args.nofile, soft_only=args.soft_only, repo=args.repo) as (proc, url, log):
        if args.scenario == "flood":
            out = flood(url, args.connections, args.procs, args.seconds, args.every, args.hold, proc, log)
            out["nofile"] = args.nofile
        elif args.scenario == "hangups":
            out = hangups(url, args.count, log)
        else:
            out = stall(url, proc.pid, args.stop_seconds)
        out["log"] = str(log)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
