"""Course text on screen: rendered Markdown in a notebook, plain text in a terminal.

Hints, answers and the tables the benchmarks print are written in Markdown. In a Jupyter
kernel they are displayed as Markdown (a table is a table, an answer is a collapsed
``<details>`` block); anywhere else they are printed as they are, which reads fine too.
"""

from __future__ import annotations


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


def collapsed(summary: str, text: str) -> None:
    """Show ``text`` (Markdown) folded under a one-line ``summary`` that opens on a click, in a
    notebook; elsewhere print the summary, then the text."""
    if in_notebook():
        from html import escape

        from IPython.display import Markdown, display

        # Blank lines around the body let the notebook render it as Markdown inside the HTML.
        display(Markdown(f"<details><summary>{escape(summary)}</summary>\n\n{text}\n\n</details>"))
    else:
        print(f"{summary}\n\n{text}")
