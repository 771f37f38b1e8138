"""Where the notebooks run the model: the device and the number format, picked once.

On a CPU the tiny model runs in float32 (half precision is slow there), with one thread
(its matrices are too small to gain from several, and threads that compete for busy cores slow
every step down). On a CUDA GPU it runs in bfloat16 where the GPU has it (compute capability
8.0 and later: A100, L4, H100...) and in float16 on older ones such as Colab's T4, which have
no bfloat16 arithmetic.

Every notebook's setup cell calls :func:`configure` and passes ``dtype=DTYPE`` to ``LLM``; the
checks that serve the model use :func:`engine_dtype` too, so a notebook and its checks run
the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


def device() -> str:
    """``"cuda"`` when a CUDA GPU is visible, else ``"cpu"``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def engine_dtype(on: str | None = None) -> str:
    """The dtype name to give ``LLM(dtype=...)`` on device ``on`` (default: :func:`device`)."""
    import torch

    from minivllm.model.loader import auto_dtype  # the engine's rule for dtype="auto"

    return str(auto_dtype(torch.device(on or device()))).removeprefix("torch.")


def configure() -> tuple[str, str]:
    """Pick the device and dtype (and one thread on a CPU); return ``(device, dtype)``."""
    import torch

    where = device()
    if where == "cpu":
        torch.set_num_threads(1)
    return where, engine_dtype(where)


def describe(where: str, dtype: str) -> str:
    """One line for the setup cell: versions, device, dtype, how Triton runs."""
    import torch

    import minivllm

    gpu = f" ({torch.cuda.get_device_name(0)})" if where == "cuda" else ""
    return (f"minivllm {minivllm.__version__}, torch {torch.__version__}; model on {where}{gpu} in "
            f"{dtype}; Triton kernels run {minivllm.TRITON_MODE}")


@contextmanager
def one_cpu_thread() -> Iterator[None]:
    """Serve the tiny model with one CPU thread, then restore the setting: its matrices are too
    small to gain from several threads, and threads that compete for busy cores slow every step
    down severalfold. Does nothing on a GPU."""
    import torch

    before = torch.get_num_threads()
    if not torch.cuda.is_available():
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
