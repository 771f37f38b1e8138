"""Course text on screen: rendered Markdown in a notebook, plain text in a terminal; and
answers stored folded.

Hints, answers and the tables the benchmarks print are written in Markdown. In a Jupyter
kernel they are displayed as Markdown (a table is a table); anywhere else they are printed as
they are, which reads fine too.

An answer (what a "predict, then run" cell prints, the answer to a notebook's question,
minivllm's own code for an exercise's part) is shown **folded**: one HTML output, a
``<details>`` block whose ``<summary>`` line opens it on a click. A notebook's stored outputs
are what GitHub's viewer and Colab show before anything runs, and both render an output's
``text/html`` (JupyterLab too), so the answer stays folded in all three. The output's
``text/plain``, for a viewer that shows plain text only, says that something is folded and
never holds the answer. :func:`is_folded` tells such an output from any other;
``tests/course/test_folded_answers.py`` checks with it that no notebook stores an answer open.
"""

from __future__ import annotations

import base64
import contextlib
import io
import sys
from collections.abc import Iterator, Mapping
from html import escape

# The text/plain of a folded output starts with this, and says no more than the summary.
FOLDED_PLAIN = "[folded]"
REVEAL = "Run it, or open it here, once you have made your prediction"


def in_notebook() -> bool:
    """True inside a Jupyter kernel (JupyterLab, Colab, nbclient), False in a terminal or a
    plain ``python``/``ipython`` session."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def markdown(text: str) -> None:
    """Show ``text`` as rendered Markdown in a notebook, else print it."""
    if in_notebook():
        from IPython.display import Markdown, display

        display(Markdown(text))
    else:
        print(text)


# --- folded outputs -----------------------------------------------------------------------------
def fold(summary: str, body_html: str) -> dict[str, str]:
    """The MIME bundle of a folded output: ``body_html`` under a one-line ``summary``."""
    return {
        "text/html": f"<details><summary>{escape(summary, quote=False)}</summary>\n{body_html}\n</details>",
        "text/plain": f"{FOLDED_PLAIN} {summary} (open the notebook in Jupyter, Colab or on GitHub and click it)",
    }


def is_folded(data: Mapping) -> bool:
    """Whether an output's ``data`` is a folded output of :func:`fold` (and nothing else)."""
    page = _text(data.get("text/html", "")).strip()
    return (set(data) == {"text/html", "text/plain"} and _text(data["text/plain"]).startswith(FOLDED_PLAIN)
            and page.startswith("<details><summary>") and page.endswith("</details>")
            and page.count("<details") == page.count("</details>"))


def pre(text: str) -> str:
    """``text`` as it prints, in HTML."""
    return f"<pre>{escape(text.rstrip(), quote=False)}</pre>"


def markdown_html(text: str) -> str:
    """Markdown rendered to HTML (with ``markdown-it-py`` or ``mistune``, one of which a
    Jupyter install and Colab have), or shown as it is in a ``<pre>`` without either."""
    try:
        from markdown_it import MarkdownIt

        return MarkdownIt("commonmark").enable("table").render(text)
    except ImportError:
        pass
    try:
        import mistune

        return mistune.html(text)
    except (ImportError, AttributeError):
        return pre(text)


def show_folded(summary: str, body_html: str) -> None:
    """Display ``body_html`` folded under ``summary`` (a notebook only)."""
    from IPython.display import display

    display(fold(summary, body_html), raw=True)


def collapsed(summary: str, text: str) -> None:
    """Show ``text`` (Markdown) folded under a one-line ``summary`` that opens on a click, in a
    notebook; elsewhere print the summary, then the text."""
    if in_notebook():
        show_folded(summary, markdown_html(text))
    else:
        print(f"{summary}\n\n{text}")


def collapsed_text(summary: str, text: str) -> None:
    """Show ``text`` as printed (code, a table of numbers) folded under ``summary`` in a
    notebook; elsewhere print the summary, then the text."""
    if in_notebook():
        show_folded(summary, pre(text))
    else:
        print(f"{summary}\n\n{text}")


@contextlib.contextmanager
def folded(summary: str = REVEAL) -> Iterator[None]:
    """Everything the block prints or displays (text, tables, plots), in its order, shown as
    one folded output under ``summary`` once the block ends, in a notebook::

        with course.folded():
            print(answer)

    Elsewhere the block prints as usual."""
    if not in_notebook():
        yield
        return
    from IPython import get_ipython
    from IPython.core.displaypub import CapturingDisplayPublisher

    shell = get_ipython()
    parts: list[tuple[str, object]] = []
    publisher = CapturingDisplayPublisher()
    publisher.outputs = _Recorded(parts)
    saved = sys.stdout, sys.stderr, shell.display_pub
    sys.stdout = sys.stderr = _Printed(parts)
    shell.display_pub = publisher
    try:
        yield
    finally:
        sys.stdout, sys.stderr, shell.display_pub = saved
        if parts:
            show_folded(summary, _html(parts))


class _Printed(io.TextIOBase):
    """A stream that records what is written to it, in order with what is displayed."""

    def __init__(self, parts: list) -> None:
        self.parts = parts

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text:
            self.parts.append(("text", text))
        return len(text)


class _Recorded(list):
    """The outputs a capturing display publisher collects, recorded in order with prints."""

    def __init__(self, parts: list) -> None:
        super().__init__()
        self.parts = parts

    def append(self, output) -> None:
        self.parts.append(("data", output["data"]))

    def clear(self) -> None:  # clear_output: drop what was shown so far
        self.parts.clear()


def _html(parts: list[tuple[str, object]]) -> str:
    pieces, printed = [], []
    for kind, value in parts + [("end", None)]:
        if kind == "text":
            printed.append(value)
            continue
        if printed:
            pieces.append(pre("".join(printed)))
            printed = []
        if kind == "data":
            pieces.append(_rich(value))
    return "\n".join(p for p in pieces if p)


def _rich(data: Mapping) -> str:
    if "text/html" in data:
        return _text(data["text/html"])
    for mime in ("image/png", "image/jpeg"):
        if mime in data:
            return f'<img src="data:{mime};base64,{_text(data[mime]).strip()}">'
    if "text/markdown" in data:
        return markdown_html(_text(data["text/markdown"]))
    return pre(_text(data.get("text/plain", "")))


def _text(value) -> str:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return "".join(value) if isinstance(value, list) else str(value)
