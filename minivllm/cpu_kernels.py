"""minivllm's C++ kernels for the CPU: built on first use, cached on disk, loaded as one module.

``minivllm/csrc/`` holds them: ``paged_attention_cpu.h`` (the ``"cpp"`` attention backend's
kernel, :mod:`minivllm.attention.cpp_backend`) and ``layer_ops_cpu.h`` (RMSNorm, rotary
embeddings and SiLU-and-multiply, :mod:`minivllm.model.layer_ops`), kernels under the model's
modules, compiled as one translation unit by ``bindings.cpp``, which names them for Python. PyTorch's C++ extension loader compiles them into one
module the first time a process asks (a C++ compiler with OpenMP and ``ninja`` are needed; both
are on Linux and Colab), about a minute once per machine on two cores, and caches the result
(:func:`build_directory`, under ``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``): later processes load it in
well under a second, offline. A build says so on stderr as it starts (what it is, and about
how long it takes) and when it is done, so that a first ``minivllm generate`` is not a silent
minute. :func:`kernel_status` says whether it builds here; without it the engine runs the same
computation in PyTorch.

This module imports nothing from ``minivllm``, so the attention package and the model can both
use it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import time
from pathlib import Path

CSRC = Path(__file__).with_name("csrc")
SOURCES = [CSRC / "bindings.cpp"]  # which includes the kernels' headers
EXTENSION_NAME = "minivllm_cpu_kernels"
# -march=native: the cache directory is the machine's own; OpenMP for at::parallel_for's threads
COMPILE_FLAGS = ["-O3", "-march=native", "-fopenmp"]

_BUILD_LOCK = threading.Lock()  # one build per process, whichever thread asks first


def build_directory() -> Path:
    """Where the extension is built and cached: under ``TORCH_EXTENSIONS_DIR`` (by default
    ``~/.cache/torch_extensions``), one directory per Python and torch version."""
    import torch

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions"
    version = f"py{sys.version_info.major}{sys.version_info.minor}_torch{torch.__version__}"
    return Path(root) / f"{EXTENSION_NAME}_{version}"


@contextlib.contextmanager
def _one_builder(directory: Path):
    """Hold the build directory against other processes, with a lock the operating system drops
    when its process dies. torch's loader has its own lock, a file that a process killed while
    building (Ctrl-C in a notebook's first cell) leaves behind, after which every later process
    would wait for it forever; whoever holds this lock knows that file is stale and removes it."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: torch's lock alone
        yield
        return
    with open(directory / "minivllm.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            (directory / "lock").unlink(missing_ok=True)  # torch's, from a builder that died
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def needs_build(directory: Path | None = None) -> bool:
    """Whether loading the kernels compiles them first: no module built in ``directory`` yet,
    or a source in ``minivllm/csrc`` newer than it."""
    directory = build_directory() if directory is None else directory
    built = [p for p in directory.glob(f"{EXTENSION_NAME}.*") if p.suffix in (".so", ".pyd")]
    if not built:
        return True
    sources = [p for p in CSRC.iterdir() if p.suffix in (".cpp", ".h")]
    return max(p.stat().st_mtime for p in sources) > min(p.stat().st_mtime for p in built)


@functools.lru_cache(maxsize=1)
def _build():
    from torch.utils.cpp_extension import load  # imports setuptools machinery: only when needed

    directory = build_directory()
    with _one_builder(directory):  # ninja rebuilds what an edited header touches
        building = needs_build(directory)
        if building:  # the first use on this machine: a minute of silence otherwise
            print(f"minivllm: compiling its C++ CPU kernels (minivllm/csrc) into {directory}; this takes "
                  "about a minute on two cores, once per machine (later runs load them in under a second)",
                  file=sys.stderr, flush=True)
        start = time.perf_counter()
        module = load(EXTENSION_NAME, [str(p) for p in SOURCES], extra_cflags=COMPILE_FLAGS,
                      extra_ldflags=["-fopenmp"], extra_include_paths=[str(CSRC)], build_directory=str(directory),
                      verbose=os.environ.get("MINIVLLM_VERBOSE_BUILD") == "1")
        if building:
            print(f"minivllm: the C++ CPU kernels are built ({time.perf_counter() - start:.0f} s)",
                  file=sys.stderr, flush=True)
        return module


def load_kernels():
    """The compiled module (built on the first call of the process, from the disk cache after
    the first build on the machine). Raises ``RuntimeError`` saying why it cannot be built."""
    try:
        with _BUILD_LOCK:
            return _build()
    except Exception as exc:  # a missing compiler, OpenMP or ninja surfaces as several types
        lines = str(exc).strip().splitlines()
        raise RuntimeError(
            f"minivllm's CPU kernels (minivllm/csrc) could not be built: {type(exc).__name__}: "
            f"{lines[-1] if lines else ''} (they need a C++ compiler with OpenMP and ninja)"
        ) from exc


@functools.lru_cache(maxsize=1)
def kernel_status() -> str | None:
    """``None`` when the kernels build (or are already built) on this machine, else the reason
    they do not. ``MINIVLLM_NO_CPP=1`` answers as a machine without them, without trying (the
    engine then takes its PyTorch paths)."""
    if os.environ.get("MINIVLLM_NO_CPP") == "1":
        return "MINIVLLM_NO_CPP=1 is set"
    try:
        load_kernels()
    except RuntimeError as exc:
        return str(exc)
    return None
