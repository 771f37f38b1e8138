"""What a message between the front end and the engine core process costs, per encoding and
per transport: the measurement behind pickle over a Unix socket pair.

Messages are the real ones (``minivllm.core.messages``): a request with a 128-token prompt, and
a step's outputs for a batch of ``--batch`` samples (one new token each, as in a decode step).

* encodings: pickle (what minivllm uses: the dataclasses as they are); msgpack (if installed:
  the fields as lists, turned back into the dataclasses on arrival -- what a msgpack design
  pays); pickle of the same lists (how much of pickle's cost is the dataclasses);
* transports: one message there and back between two processes, over a socket pair with a
  4-byte length before each frame (minivllm's) and, if pyzmq is installed, over a ZeroMQ PAIR
  socket on ``ipc://`` (vLLM's).

    python benchmarks/core_transport.py [--batch 200] [--repeats 2000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pickle
import socket
import statistics
import sys
import tempfile
import time

from minivllm.core.messages import (
    CoreState,
    EngineCoreOutputs,
    EngineCoreRequest,
    RequestDelta,
    StepSummary,
)
from minivllm.sampling_params import SamplingParams

try:
    import msgpack
except ImportError:  # optional: only this benchmark uses it
    msgpack = None
try:
    import zmq
except ImportError:
    zmq = None

PROTOCOL = pickle.HIGHEST_PROTOCOL


def step_message(batch: int) -> EngineCoreOutputs:
    deltas = [RequestDelta(f"cmpl-{i:032x}", [1000 + i % 900], num_cached_tokens=16) for i in range(batch)]
    return EngineCoreOutputs(deltas, CoreState(batch, 0, batch * 12, 16384, batch), StepSummary(batch, 0, 0, 0))


def request_message() -> EngineCoreRequest:
    return EngineCoreRequest("cmpl-" + "ab" * 16, list(range(1, 129)), SamplingParams(temperature=0, max_tokens=128),
                             time.perf_counter())


# --- encodings ------------------------------------------------------------------------------------
def as_lists(msg: EngineCoreOutputs) -> list:
    s, step = msg.state, msg.step
    return [[[d.request_id, d.new_token_ids, d.finish_reason, d.stop_reason, d.error, d.num_cached_tokens]
             for d in msg.deltas],
            [s.num_running, s.num_waiting, s.kv_blocks_used, s.kv_blocks_total, s.num_unfinished],
            [step.num_batched_seqs, step.num_preemptions, step.prefix_cache_queries, step.prefix_cache_hits]]


def from_lists(raw: list) -> EngineCoreOutputs:
    deltas, state, step = raw
    return EngineCoreOutputs([RequestDelta(r, t, f, s, e, c) for r, t, f, s, e, c in deltas],
                             CoreState(*state), StepSummary(*step))


def time_us(fn, repeats: int) -> float:
    """Median of 7 batches of ``repeats // 7`` calls, in microseconds per call."""
    per_batch = max(1, repeats // 7)
    times = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(per_batch):
            fn()
        times.append((time.perf_counter() - t) / per_batch)
    return 1e6 * statistics.median(times)


def encodings(batch: int, repeats: int) -> list[tuple[str, str, float, int]]:
    rows = []
    for name, msg in (("step outputs", step_message(batch)), ("request", request_message())):
        blob = pickle.dumps(msg, protocol=PROTOCOL)
        rows.append((name, "pickle (dataclasses)", time_us(lambda m=msg: pickle.loads(pickle.dumps(m, protocol=PROTOCOL)),
                                                           repeats), len(blob)))
        if name == "step outputs":
            lists = as_lists(msg)
            rows.append((name, "pickle (lists)", time_us(lambda m=msg: from_lists(pickle.loads(pickle.dumps(
                as_lists(m), protocol=PROTOCOL))), repeats), len(pickle.dumps(lists, protocol=PROTOCOL))))
            if msgpack is not None:
                packed = msgpack.packb(lists)
                rows.append((name, "msgpack (lists)", time_us(lambda m=msg: from_lists(msgpack.unpackb(
                    msgpack.packb(as_lists(m)))), repeats), len(packed)))
    return rows


# --- transports -------------------------------------------------------------------------------------
def _echo_socket(sock: socket.socket) -> None:
    while True:
        head = _exactly(sock, 4)
        if not head:
            return
        sock.sendall(head + _exactly(sock, int.from_bytes(head, "big")))


def _exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return b""
        buf += chunk
    return buf


def _echo_zmq(address: str) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.PAIR)
    s.connect(address)
    while (frame := s.recv()) != b"":
        s.send(frame)
    s.close()
    ctx.term()


def round_trips(batch: int, repeats: int) -> list[tuple[str, float]]:
    msg = step_message(batch)
    rows = []
    ctx = mp.get_context("spawn")
    ours, theirs = socket.socketpair()
    proc = ctx.Process(target=_echo_socket, args=(theirs,))
    proc.start()
    theirs.close()

    def socket_trip() -> None:
        payload = pickle.dumps(msg, protocol=PROTOCOL)
        ours.sendall(len(payload).to_bytes(4, "big") + payload)
        head = _exactly(ours, 4)
        pickle.loads(_exactly(ours, int.from_bytes(head, "big")))

    rows.append(("socket pair, 4-byte length + pickle", time_us(socket_trip, repeats)))
    ours.close()
    proc.join(10)
    if zmq is not None:
        with tempfile.TemporaryDirectory() as tmp:
            address = f"ipc://{os.path.join(tmp, 'core')}"
            zctx = zmq.Context()
            s = zctx.socket(zmq.PAIR)
            s.bind(address)
            proc = ctx.Process(target=_echo_zmq, args=(address,))
            proc.start()

            def zmq_trip() -> None:
                s.send(pickle.dumps(msg, protocol=PROTOCOL))
                pickle.loads(s.recv())

            rows.append(("ZeroMQ PAIR over ipc:// + pickle", time_us(zmq_trip, repeats)))
            s.send(b"")
            proc.join(10)
            s.close()
            zctx.term()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=200, help="samples in the step's outputs")
    ap.add_argument("--repeats", type=int, default=2000)
    args = ap.parse_args(argv)
    print(f"$ python benchmarks/core_transport.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"load average {os.getloadavg()[0]:.2f}; msgpack {'installed' if msgpack else 'not installed'}, "
          f"pyzmq {'installed' if zmq else 'not installed'}\n")
    print("| message | encoding | encode + decode (µs) | bytes |")
    print("|---|---|---:|---:|")
    for name, how, us, size in encodings(args.batch, args.repeats):
        print(f"| {name} ({args.batch} samples) | {how} | {us:.1f} | {size:,} |" if name == "step outputs"
              else f"| {name} (128-token prompt) | {how} | {us:.1f} | {size:,} |")
    print("\n| transport: the step's outputs there and back | µs per round trip |\n|---|---:|")
    for how, us in round_trips(args.batch, args.repeats // 4):
        print(f"| {how} | {us:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
