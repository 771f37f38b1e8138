"""The ``minivllm serve`` command line: server options plus every ``EngineArgs`` field.

Engine flags are generated from the ``EngineArgs`` dataclass, so a new engine argument is a new
flag without touching this file: ``max_num_seqs`` becomes ``--max-num-seqs``, a bool such as
``enable_prefix_caching`` becomes ``--enable-prefix-caching`` / ``--no-enable-prefix-caching``,
and the string options with a fixed set of values get ``choices``. A flag that is not given
leaves the engine's own default in place.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing

from minivllm.config import ATTENTION_BACKENDS, KV_CACHE_DTYPES, KV_CACHES, SCHEDULERS, EngineArgs
from minivllm.core.scheduler import SCHEDULING_POLICIES
from minivllm.entrypoints.async_llm import DEFAULT_STALL_TIMEOUT
from minivllm.entrypoints.front_door import DEFAULT_MAX_REQUEST_BYTES, DEFAULT_READ_TIMEOUT

DEFAULT_PORT = 8000
# Where the server's defaults differ from the engine's, by measurement (docs/serving.md, "Server
# defaults"): the engine core in a process of its own; and on a CPU 128 seats, as vLLM's
# server on a CPU has: a smaller batch steps faster while the front end works beside it.
SERVER_ENGINE_DEFAULTS = {"engine_core_process": True}
CPU_SERVER_ENGINE_DEFAULTS = {"max_num_seqs": 128}

# fields with a fixed set of names (the plug-in points also take objects, but not from a shell)
CHOICES = {
    "scheduler": SCHEDULERS,
    "kv_cache": KV_CACHES,
    "attention_backend": ATTENTION_BACKENDS,
    "scheduling_policy": SCHEDULING_POLICIES,
    "kv_cache_dtype": KV_CACHE_DTYPES,
}


def _base_type(annotation) -> type:
    """``int | None`` -> ``int``; ``bool`` -> ``bool``; a plug-in point (``Any``) -> ``str``."""
    if annotation is typing.Any:
        return str
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        (inner,) = [a for a in typing.get_args(annotation) if a is not type(None)]
        return inner
    return annotation


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine arguments (see minivllm/config.py; default: the engine's)")
    hints = typing.get_type_hints(EngineArgs)
    for f in dataclasses.fields(EngineArgs):
        flag = "--" + f.name.replace("_", "-")
        kind = _base_type(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = f"default: {SERVER_ENGINE_DEFAULTS.get(f.name, default)}"
        if f.name in CPU_SERVER_ENGINE_DEFAULTS:
            help_text += f" ({CPU_SERVER_ENGINE_DEFAULTS[f.name]} on a CPU)"
        if kind is bool:
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                               default=argparse.SUPPRESS, help=help_text)
        else:
            group.add_argument(flag, dest=f.name, type=kind, choices=CHOICES.get(f.name),
                               default=argparse.SUPPRESS, help=help_text)


def server_engine_defaults(device: str | None) -> dict:
    """The server's own defaults for a model served on ``device`` (None: the engine's choice,
    a GPU if there is one)."""
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    on_cpu = not str(device).startswith("cuda")
    return {**SERVER_ENGINE_DEFAULTS, **(CPU_SERVER_ENGINE_DEFAULTS if on_cpu else {})}


def engine_args_from(namespace: argparse.Namespace) -> dict:
    """The engine arguments given on the command line; absent ones keep the server's default
    (:func:`server_engine_defaults`) or the engine's."""
    names = {f.name for f in dataclasses.fields(EngineArgs)}
    given = {k: v for k, v in vars(namespace).items() if k in names}
    return {**server_engine_defaults(given.get("device")), **given}


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default=None,
                        help="checkpoint directory or hub name (default: the shipped tiny model)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--served-model-name", default=None,
                        help="the name clients pass as 'model' (default: the model argument, or 'minivllm-tiny')")
    parser.add_argument("--max-waiting", type=int, default=None,
                        help="refuse new requests with 503 while this many wait for a seat (default: no limit)")
    parser.add_argument("--shutdown-timeout", type=float, default=20.0,
                        help="on SIGINT/SIGTERM, seconds to let running requests finish before aborting them "
                             "(a second signal aborts them at once and exits with 128 + the signal)")
    parser.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer <key>' on /v1 routes (default: the "
                             "MINIVLLM_API_KEY environment variable; unset: no key)")
    parser.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES,
                        help=f"refuse larger request bodies with 413 before parsing them (default: "
                             f"{DEFAULT_MAX_REQUEST_BYTES})")
    parser.add_argument("--request-read-timeout", type=float, default=DEFAULT_READ_TIMEOUT,
                        help="seconds a client may take to send a request's headers, and again its body "
                             f"(then 408 or a closed connection; default: {DEFAULT_READ_TIMEOUT:g})")
    parser.add_argument("--max-connections", type=int, default=None,
                        help="open HTTP connections at most; past it the oldest idle or incomplete one is "
                             "closed (default: 4096, or less where the open-file limit is lower)")
    parser.add_argument("--core-stall-timeout", type=float, default=DEFAULT_STALL_TIMEOUT,
                        help="/health answers 503 once the engine core has sent nothing for this many "
                             f"seconds while requests are pending (default: {DEFAULT_STALL_TIMEOUT:g})")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    add_engine_arguments(parser)
