"""What a running server exposes at ``GET /metrics``, in Prometheus' text exposition format.

A scraper (Prometheus, Grafana Agent, ``curl``) reads the current value of every metric; graphs
and alerts come from its time series. Three kinds are enough here:

* a **gauge** is a number that goes up and down (requests running, KV-cache usage);
* a **counter** only goes up (tokens generated, preemptions); rates come from its slope;
* a **histogram** counts observations into cumulative buckets ``le`` ("less than or equal"),
  plus their sum and count, so percentiles can be estimated on the scraper side without the
  server keeping every sample (time to first token, inter-token latency, batch size).

The format is a few lines of text per metric (``# HELP``, ``# TYPE``, then samples), so we
write it ourselves rather than depend on ``prometheus_client``: the code below is the whole
format as this server uses it, and the test suite parses the output with ``prometheus_client``'s
own parser when it is installed. Names follow Prometheus conventions (``_seconds``, ``_total``)
and mirror vLLM's ``vllm:*`` metrics (see ``docs/serving.md``).

``AsyncLLM`` writes on the server's event loop, as it processes each step's outputs; ``render()``
may be called from any thread (the route's, a test's, a notebook's): one lock guards every value.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

PREFIX = "minivllm_"

# Bucket edges in seconds (log-spaced, 1 ms to minutes) and in sequences per step.
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                25.0, 50.0, 100.0)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5,
               5.0)
E2E_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0,
               600.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def _format_value(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


def _escape(label_value: str) -> str:
    return label_value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _labels(pairs: Sequence[tuple[str, str]]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


@dataclass
class _Metric:
    name: str  # without PREFIX
    help: str

    kind = "untyped"

    @property
    def full_name(self) -> str:
        return PREFIX + self.name

    def header(self, name: str | None = None) -> list[str]:
        name = name or self.full_name
        return [f"# HELP {name} {self.help}", f"# TYPE {name} {self.kind}"]


@dataclass
class Gauge(_Metric):
    value: float = 0.0
    kind = "gauge"

    def set(self, value: float) -> None:
        self.value = float(value)

    def render(self) -> list[str]:
        return [*self.header(), f"{self.full_name} {_format_value(self.value)}"]


@dataclass
class Counter(_Metric):
    """A counter with an optional single label (``label``); samples end in ``_total``."""

    label: str | None = None
    values: dict[str, float] = field(default_factory=dict)
    kind = "counter"

    def __post_init__(self) -> None:
        if self.label is None:
            self.values[""] = 0.0

    def inc(self, amount: float = 1.0, label_value: str = "") -> None:
        if amount < 0:
            raise ValueError(f"a counter only goes up; got an increment of {amount}")
        self.values[label_value] = self.values.get(label_value, 0.0) + amount

    def get(self, label_value: str = "") -> float:
        return self.values.get(label_value, 0.0)

    def render(self) -> list[str]:
        lines = self.header(self.full_name + "_total")  # the text format names counters by sample
        for label_value, total in sorted(self.values.items()):
            pairs = [(self.label, label_value)] if self.label else []
            lines.append(f"{self.full_name}_total{_labels(pairs)} {_format_value(total)}")
        return lines


@dataclass
class Histogram(_Metric):
    """Cumulative buckets: ``_bucket{le="x"}`` counts observations <= x; ``le="+Inf"`` counts all."""

    buckets: tuple[float, ...] = ()
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; last = +Inf
    total: float = 0.0
    kind = "histogram"

    def __post_init__(self) -> None:
        if list(self.buckets) != sorted(set(self.buckets)):
            raise ValueError(f"histogram {self.name}: buckets must increase strictly, got {self.buckets}")
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def render(self) -> list[str]:
        lines, running = self.header(), 0
        for edge, n in zip((*self.buckets, math.inf), self.counts, strict=True):
            running += n
            le = _format_value(edge) if math.isinf(edge) else repr(float(edge))
            lines.append(f'{self.full_name}_bucket{{le="{le}"}} {running}')
        lines.append(f"{self.full_name}_sum {_format_value(self.total)}")
        lines.append(f"{self.full_name}_count {running}")
        return lines


class ServerMetrics:
    """Every metric the server exposes. ``AsyncLLM`` calls the ``record_*`` and ``set_*``
    methods; ``render()`` (any thread) returns the exposition text."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = Gauge("num_requests_running", "Sequences holding a seat in the running batch.")
        self.waiting = Gauge("num_requests_waiting", "Sequences queued for admission.")
        self.kv_usage = Gauge("kv_cache_usage_ratio", "Fraction of KV-cache blocks in use (0 to 1).")
        self.prefix_hit_rate = Gauge(
            "prefix_cache_hit_rate", "Prompt tokens served from the prefix cache / prompt tokens admitted."
        )
        self.preemptions = Counter("num_preemptions", "Requests preempted (blocks freed, to be recomputed).")
        self.prompt_tokens = Counter("prompt_tokens", "Prompt tokens of ended requests (once per request).")
        self.generation_tokens = Counter("generation_tokens", "Tokens generated.")
        self.finished = Counter(
            "request_success", "Sequences ended (n per request), by finish reason: stop, length, abort, error.",
            "finished_reason",
        )
        self.failed = Counter("request_failure", "Requests failed by an engine error (once per request).")
        self.rejected = Counter("request_rejected", "Requests refused at the door, by reason.", "reason")
        self.steps = Counter("engine_steps", "Engine steps run.")
        self.spec_drafts = Counter("spec_decode_num_draft_tokens", "Speculative drafts verified.")
        self.spec_accepted = Counter("spec_decode_num_accepted_tokens", "Speculative drafts the target accepted.")
        self.ttft = Histogram("time_to_first_token_seconds", "Arrival to first generated token.", TTFT_BUCKETS)
        self.itl = Histogram(
            "inter_token_latency_seconds", "Gap between consecutive token deliveries of a request.", ITL_BUCKETS
        )
        self.e2e = Histogram("e2e_request_latency_seconds", "Arrival to the request's last output.", E2E_BUCKETS)
        self.batch_size = Histogram(
            "iteration_batch_size", "Sequences in one engine step's forward pass.", BATCH_BUCKETS
        )
        # the engine core's liveness, as the server sees it (AsyncLLM.health)
        self.in_flight = Gauge("num_requests_in_flight",
                               "Sequences sent to the engine core and not ended (the server's count).")
        self.core_up = Gauge("engine_core_up", "1 while the engine core runs and answers, else 0.", 1.0)
        self.core_silent = Gauge("engine_core_silent_seconds",
                                 "Seconds since the engine core last answered, while work is pending (else 0).")
        # the HTTP front door (front_door.ConnectionGuard)
        self.http_connections = Gauge("http_connections_open", "HTTP connections open (accepted, not closed).")
        self.connections_shed = Counter(
            "http_connections_shed",
            "HTTP connections closed to make room, by reason: incomplete (no request head yet), "
            "idle (keep-alive), refused (every slot busy: a bare 503).", "reason",
        )
        for reason in ("incomplete", "idle", "refused"):
            self.connections_shed.inc(0, reason)
        self.accept_errors = Counter("http_accept_errors", "accept() calls that failed (no descriptor or memory).")
        self._all = [
            self.running, self.waiting, self.kv_usage, self.prefix_hit_rate, self.in_flight, self.core_up,
            self.core_silent, self.http_connections, self.connections_shed, self.accept_errors, self.preemptions,
            self.prompt_tokens, self.generation_tokens, self.finished, self.failed, self.rejected,
            self.steps, self.spec_drafts, self.spec_accepted, self.ttft, self.itl, self.e2e, self.batch_size,
        ]

    @property
    def lock(self) -> threading.Lock:
        return self._lock

    def render(self) -> str:
        with self._lock:
            lines = [line for metric in self._all for line in metric.render()]
        return "\n".join(lines) + "\n"
