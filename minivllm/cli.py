"""The ``minivllm`` command line: ``minivllm generate "Once upon a time"``, ``minivllm serve``."""

from __future__ import annotations

import argparse
import sys

from minivllm.config import ATTENTION_BACKENDS


def _generate(args: argparse.Namespace) -> int:
    from minivllm import LLM, SamplingParams

    llm = LLM(args.model, attention_backend=args.attention_backend)
    params = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        max_tokens=args.max_tokens, seed=args.seed,
    )
    if args.stream:
        for out in llm.stream(args.prompt, params):
            print(out.outputs[0].text, end="", flush=True)
        print()
        return 0
    for out in llm.generate(args.prompt, params, use_tqdm=False):
        print(out.outputs[0].text)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from minivllm.entrypoints.launcher import run_server

    return run_server(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minivllm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="complete one or more prompts and print the text")
    gen.add_argument("prompt", nargs="+", help="prompt text (several prompts are batched)")
    gen.add_argument("--model", default=None, help="checkpoint directory or hub name (default: the tiny model)")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--attention-backend", default="auto", choices=ATTENTION_BACKENDS)
    gen.add_argument("--stream", action="store_true", help="print tokens as they arrive")
    gen.set_defaults(func=_generate)
    serve = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    from minivllm.entrypoints.cli_args import add_serve_arguments

    add_serve_arguments(serve)
    serve.set_defaults(func=_serve)
    _add_course_commands(sub)
    return parser


def _add_course_commands(sub) -> None:
    """Course subcommands (``grade``, ``course make-exercises``) live in ``minivllm.course``."""
    try:
        from minivllm.course.cli import add_commands
    except ImportError:
        return
    add_commands(sub)


# Mistakes in what the user asked for (a bad argument, a missing file, an unknown exercise):
# one line and exit status 2, like argparse's own errors. Anything else is a bug: traceback.
USER_ERRORS = (ValueError, TypeError, FileNotFoundError, KeyError)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
