"""Decide, before any Triton kernel is defined, whether kernels run compiled or interpreted.

Triton reads ``TRITON_INTERPRET`` when a ``@triton.jit`` function is *defined*, not when it is
launched. So this module must run before any kernel module is imported: the attention package's
``__init__.py`` imports it first, and importing any module of the package (a kernel module
included) runs that ``__init__.py`` before the module itself. On a machine without a CUDA device
we switch on the interpreter, which runs kernels on the CPU with NumPy: slow, but exact enough to
learn from and to test against. This module imports nothing else from ``minivllm``.

Triton's own library (``tl.zeros``, ``tl.sum``, ``tl.max``, ``tl.cdiv``, ...) is made of
``@triton.jit`` functions too, defined when ``triton`` is first imported. If something imported
Triton before us (``import triton``, ``import torch._inductor``, a ``transformers`` ``generate``
call), those were defined for a GPU, and an interpreted kernel that calls one fails with
``Cannot call @triton.jit'd outside of the scope of a kernel``. :func:`configure_triton` then
rebuilds them as interpreted functions, which is what Triton would have built had the flag been
set in time; ``TritonAttentionBackend`` checks that this worked for every function its kernels
reach, and says clearly what to do if not.
"""

from __future__ import annotations

import inspect
import os
import sys
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
    if os.environ.get("TRITON_INTERPRET") == "1":
        reinterpret_triton_library()
    return triton_mode()


def triton_mode() -> str:
    """'interpreted', 'compiled', or 'unavailable' (Triton not installed)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "unavailable"
    return "interpreted" if os.environ.get("TRITON_INTERPRET") == "1" else "compiled"


def _triton_namespaces() -> list[object]:
    """Every loaded ``triton.*`` module, and the classes defined in them (``tl.tensor`` carries
    library functions as methods, e.g. ``x.sum()``)."""
    namespaces: list[object] = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "triton" or name.startswith("triton.")):
            continue
        namespaces.append(module)
        for value in list(vars(module).values()):
            if inspect.isclass(value) and getattr(value, "__module__", "").startswith("triton"):
                namespaces.append(value)
    return namespaces


def reinterpret_triton_library() -> int:
    """Rebuild Triton's library ``@jit`` functions that were defined compiled as interpreted ones.

    Needed only when ``triton`` was imported before ``TRITON_INTERPRET`` was set. Every module or
    class attribute that refers to such a function is pointed at its rebuilt twin (one twin per
    function, so aliases such as ``tl.max`` and ``tl.standard.max`` stay the same object).
    Returns how many functions were rebuilt (0 in the usual import order).
    """
    if "triton" not in sys.modules:
        return 0
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    rebuilt: dict[int, InterpretedFunction] = {}
    for namespace in _triton_namespaces():
        for key, value in list(vars(namespace).items()):
            if type(value) is not JITFunction:
                continue
            twin = rebuilt.get(id(value))
            if twin is None:
                # the keywords @triton.jit passes when the flag is on
                twin = InterpretedFunction(
                    value.fn, version=value.version, do_not_specialize=value.do_not_specialize,
                    do_not_specialize_on_alignment=value.do_not_specialize_on_alignment,
                    debug=value.debug, noinline=value.noinline, repr=getattr(value, "_repr", None),
                    launch_metadata=value.launch_metadata,
                )
                rebuilt[id(value)] = twin
            setattr(namespace, key, twin)
    return len(rebuilt)


TRITON_MODE = configure_triton()
