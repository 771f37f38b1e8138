"""The stored result of the paged-decode kernel benchmark, for notebooks that run without a GPU.

``benchmarks/attention_kernels.py --store DIR`` writes one JSON file per GPU,
``attention_kernels-<gpu>.json`` (``scripts/gpu_check.sh`` stores it under its output folder;
copied into ``benchmarks/results/``, it is the course's record). On a machine without a GPU a
notebook cannot measure the kernel, but it can show what was measured, with the GPU named:
:func:`stored_kernel_benchmark` returns that record, or ``None`` when there is none.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULTS_DIR = Path("benchmarks") / "results"  # under the course root
PREFIX = "attention_kernels-"


def result_name(device: str) -> str:
    """The file name for one GPU's result: ``attention_kernels-nvidia-h100-80gb-hbm3.json``."""
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    if not slug:
        raise ValueError(f"device name {device!r} has no letters or digits to name a file after")
    return f"{PREFIX}{slug}.json"


def store_kernel_benchmark(record: dict[str, Any], directory: str | Path) -> Path:
    """Write one benchmark record (it must name its ``device``) as ``directory/<result_name>``."""
    if not isinstance(record.get("device"), str) or not isinstance(record.get("rows"), list):
        raise ValueError("a kernel benchmark record needs a 'device' name and a list of 'rows'")
    path = Path(directory) / result_name(record["device"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


@dataclass(frozen=True)
class KernelBenchmark:
    """One GPU's measurement of paged decode attention (see ``benchmarks/attention_kernels.py``)."""

    device: str  # torch.cuda.get_device_name()
    measured_at: str  # ISO date of the run
    peak_bandwidth: float | None  # the card's peak HBM bandwidth, bytes/s (None: not in the table)
    versions: dict[str, str]  # torch, triton, CUDA
    config: dict[str, Any]  # heads, head_dim, block size, dtype...
    rows: list[dict[str, Any]] = field(repr=False)  # one per (batch, context), as the script wrote
    path: Path | None = None

    @property
    def measured(self) -> list[dict[str, Any]]:
        """The rows that ran (a case too large for the card's memory is recorded as skipped)."""
        return [r for r in self.rows if "skipped" not in r]

    def paging_cost(self) -> tuple[float, float]:
        """``(median, largest)`` of ``paged time / contiguous time - 1`` over the measured cases:
        what the block table costs the same kernel on the same data."""
        costs = [r["paging_cost"] for r in self.measured]
        if not costs:
            raise ValueError(f"{self.path}: no measured case")
        return statistics.median(costs), max(costs)

    def best_peak_fraction(self) -> float | None:
        """The highest achieved fraction of peak HBM bandwidth (None: peak unknown)."""
        fractions = [r["peak_fraction"] for r in self.measured if r.get("peak_fraction") is not None]
        return max(fractions) if fractions else None

    def describe(self) -> str:
        """One sentence with the figures, the GPU and the date."""
        median, largest = self.paging_cost()
        best = self.best_peak_fraction()
        bandwidth = f"; paged decode reached {100 * best:.0f}% of peak HBM bandwidth" if best is not None else ""
        return (f"On {self.device} ({self.config.get('dtype', '?')}, block {self.config.get('block_size', '?')}, "
                f"measured {self.measured_at}): paging cost the kernel {100 * median:+.1f}% (median over "
                f"{len(self.measured)} batch x context cases, at most {100 * largest:+.1f}%){bandwidth}.")

    @classmethod
    def from_file(cls, path: str | Path) -> KernelBenchmark:
        path = Path(path)
        try:
            record = json.loads(path.read_text())
            return cls(device=record["device"], measured_at=record.get("measured_at", "?"),
                       peak_bandwidth=record.get("peak_bandwidth_Bps"),
                       versions={k: record[k] for k in ("torch", "triton", "cuda") if k in record},
                       config=record.get("config", {}), rows=list(record["rows"]), path=path)
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{path} is not a kernel benchmark record ({type(err).__name__}: {err})") from err


def stored_kernel_benchmark(device: str | None = None, root: str | Path | None = None) -> KernelBenchmark | None:
    """The stored kernel benchmark of ``device`` (a ``torch.cuda.get_device_name()``), or, without
    one, the most recent of any GPU; ``None`` when no result is stored. ``root``: the course root
    (default: :func:`minivllm.course.course_file`'s search)."""
    if root is not None:
        directory = Path(root) / RESULTS_DIR
    else:  # the course's own results, else those beside the installed package
        from minivllm.course.loader import CourseFileMissing, course_file

        try:
            directory = course_file(RESULTS_DIR)
        except CourseFileMissing:
            return None
    if device is not None:
        path = directory / result_name(device)
        return KernelBenchmark.from_file(path) if path.is_file() else None
    found = [KernelBenchmark.from_file(p) for p in sorted(directory.glob(f"{PREFIX}*.json"))]
    return max(found, key=lambda b: b.measured_at) if found else None
