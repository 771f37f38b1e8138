"""Accelerators the simulator knows: memory size, memory bandwidth, peak dense FLOP/s, price.

Every number below comes from the vendor's public datasheet (cited per entry), except the
hourly price, which is an *assumption*: a round on-demand rental price of the kind GPU clouds
charged in 2025. Prices move every quarter and differ by a factor of 2-4 between providers, so
treat them as knobs, not facts: ``HARDWARE["H100-SXM"].with_price(4.0)`` gives a copy at another
price.

Conventions:
* ``memory_bytes`` is the capacity printed on the datasheet in decimal gigabytes (1 GB = 1e9 B).
  The driver usually reports a little more (an "80 GB" H100 shows ~81,559 MiB, about 85.5e9 B);
  we stay with the datasheet figure, which errs on the side of less KV cache.
* ``peak_flops`` is the *dense* 16-bit tensor-core rate (BF16 or FP16, fp32 accumulate).
  Datasheets print the 2:4 structured-sparsity figure in big letters; that is twice the dense
  rate and useless for LLM inference, so we halve it where needed. Weight-only quantised models
  (W4A16 / W8A16, e.g. AWQ) still multiply in 16-bit, so this is the right roof for them too.
* ``memory_bandwidth`` is the peak DRAM bandwidth in bytes/s. L4 and T4 use GDDR6, not HBM;
  the field means "device memory" either way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

GB = 1e9
TB = 1e12


@dataclass(frozen=True)
class Hardware:
    name: str
    memory_bytes: float  # device memory capacity
    memory_bandwidth: float  # bytes / second, peak
    peak_flops: float  # dense bf16/fp16 tensor-core FLOP / second
    usd_per_hour: float  # ASSUMPTION: rental price, edit freely
    source: str  # where the spec numbers come from

    @property
    def ridge_point(self) -> float:
        """FLOPs per byte at which a kernel stops being memory-bound (roofline knee)."""
        return self.peak_flops / self.memory_bandwidth

    def with_price(self, usd_per_hour: float) -> Hardware:
        return dataclasses.replace(self, usd_per_hour=usd_per_hour)

    def describe(self) -> str:
        return (
            f"{self.name}: {self.memory_bytes / GB:.0f} GB at {self.memory_bandwidth / TB:.2f} TB/s, "
            f"{self.peak_flops / TB:.0f} TFLOP/s dense 16-bit, ridge {self.ridge_point:.0f} FLOP/B, "
            f"${self.usd_per_hour:.2f}/h (assumed)"
        )


HARDWARE: dict[str, Hardware] = {
    h.name: h
    for h in [
        # NVIDIA H100 Tensor Core GPU datasheet (SXM5 column): 80 GB HBM3, 3.35 TB/s,
        # BF16/FP16 tensor core "1,979 TFLOPS" with sparsity -> 989.5 dense.
        Hardware("H100-SXM", 80 * GB, 3.35 * TB, 989.5 * TB, 2.50, "NVIDIA H100 datasheet (SXM)"),
        # NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e, 4.8 TB/s, same compute
        # as H100 SXM ("1,979 TFLOPS" BF16 with sparsity -> 989.5 dense).
        Hardware("H200", 141 * GB, 4.8 * TB, 989.5 * TB, 3.50, "NVIDIA H200 datasheet (SXM)"),
        # NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): 80 GB HBM2e, 2,039 GB/s,
        # BF16 tensor core 312 TFLOPS dense (624 with sparsity).
        Hardware("A100-80GB", 80 * GB, 2.039 * TB, 312 * TB, 1.60, "NVIDIA A100 datasheet (80GB SXM)"),
        # NVIDIA L4 datasheet: 24 GB GDDR6, 300 GB/s, BF16/FP16 tensor "242 TFLOPS" with
        # sparsity -> 121 dense.
        Hardware("L4", 24 * GB, 0.300 * TB, 121 * TB, 0.70, "NVIDIA L4 datasheet"),
        # NVIDIA T4 datasheet: 16 GB GDDR6, 320 GB/s, mixed-precision (FP16/FP32) 65 TFLOPS.
        # Turing has no BF16; the FP16 rate is the roof.
        Hardware("T4", 16 * GB, 0.320 * TB, 65 * TB, 0.35, "NVIDIA T4 datasheet"),
    ]
}


def get_hardware(name: str | Hardware) -> Hardware:
    """Look a card up by name (case-insensitive; "H100" means the SXM part)."""
    if isinstance(name, Hardware):
        return name
    aliases = {"h100": "H100-SXM", "a100": "A100-80GB"}
    key = aliases.get(name.lower(), name)
    for hw_name, hw in HARDWARE.items():
        if hw_name.lower() == key.lower():
            return hw
    raise KeyError(f"unknown hardware {name!r}; known: {', '.join(HARDWARE)}")
