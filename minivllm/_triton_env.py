"""Decide, before any Triton kernel is defined, whether kernels run compiled or interpreted.

Triton reads ``TRITON_INTERPRET`` when a ``@triton.jit`` function is *defined*, not when it is
launched. So this module must run before any kernel module is imported; ``minivllm/__init__.py``
imports it first. On a machine without a CUDA device we switch on the interpreter, which runs
kernels on the CPU with NumPy: slow, but exact enough to learn from and to test against.
"""

from __future__ import annotations

import os
import warnings


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return False
    return bool(torch.cuda.is_available())


def configure_triton() -> str:
    """Set ``TRITON_INTERPRET=1`` when no CUDA device is present. Returns the mode name.

    An explicit setting is respected (compiling kernels for a GPU on a CPU machine, for
    example, needs ``TRITON_INTERPRET=0``), with a warning when kernels could not launch.
    """
    setting = os.environ.get("TRITON_INTERPRET")
    if not _cuda_available():
        if setting is None:
            os.environ["TRITON_INTERPRET"] = "1"
        elif setting != "1":
            warnings.warn(
                f"TRITON_INTERPRET={setting!r} on a machine without a CUDA device: Triton kernels "
                "can be compiled but not launched here (unset it to use the interpreter)",
                stacklevel=2,
            )
    return triton_mode()


def triton_mode() -> str:
    """'interpreted', 'compiled', or 'unavailable' (Triton not installed)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "unavailable"
    return "interpreted" if os.environ.get("TRITON_INTERPRET") == "1" else "compiled"


TRITON_MODE = configure_triton()
