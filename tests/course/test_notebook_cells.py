"""Rules for the notebooks' cells and stored outputs, checked without running them:

- a ``# NBVAL_CHECK_OUTPUT`` cell prints only what is the same on every device: counts, exact
  integers, comparisons (``identical: True``), never generated text, token ids sampled by the
  model, beam scores or log-probabilities, which move with the number format (float32 on a
  CPU, bfloat16 or float16 on a GPU);
- every notebook with an exercise continues with ``ex = course.working(ex)`` after its check;
- answers (``course.answer``) are never stored, and what a "predict, then run" question reveals
  opens folded (tag ``reveal``; ``tests/course/test_folded_answers.py`` checks how);
- no stored output (nor a markdown cell) holds a reference answer: no solution marker, no two
  consecutive significant lines of a ``solutions/`` answer; a cell that prints an exercise's code
  does it with ``course.show_code``, whose output is never stored;
- a notebook opens unchanged in JupyterLab: this environment's kernelspec, no widget state, no
  widget output that would show as a bare ``VBox(...)`` before the cell runs;
- what a student reads fits the page: code lines of at most 100 characters, prose lines of at
  most 100 (tables and links aside), printed lines of at most 120, no Markdown table printed as
  raw text.
"""

from __future__ import annotations

import ast
import html
import re
from pathlib import Path

import nbformat
import pytest

from minivllm.course import answers
from minivllm.course.display import is_folded

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
IDS = [p.name.split("_")[0] for p in NOTEBOOKS]

# Attributes and names whose value depends on the number format the model ran in.
DEVICE_DEPENDENT = {"text", "texts", "score", "scores", "logprob", "logprobs", "prompt_logprobs",
                    "cumulative_logprob", "decode", "token_ids", "input_ids"}
# Calls that turn such a value into something that does not depend on it.
INVARIANT_CALLS = {"len", "all", "any", "bool", "isinstance", "type"}

CODE_WIDTH, PROSE_WIDTH, OUTPUT_WIDTH = 100, 100, 120


def _cells(path: Path) -> list:
    return nbformat.read(path, as_version=4).cells


def device_dependent(code: str) -> list[str]:
    """What a cell prints that depends on the device's number format: the expressions printed
    (``print`` arguments, f-string fields) that read one of :data:`DEVICE_DEPENDENT`, unless
    compared (``==``, ``<``) or reduced to a count or a truth value first."""
    python = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in code.splitlines())
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Compare):
            return
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in INVARIANT_CALLS:
            return
        name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
        if name in DEVICE_DEPENDENT:
            found.append(ast.unparse(node))
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    for node in ast.walk(ast.parse(python)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("print", "display"):
            for arg in node.args:
                visit(arg)
    return found


def test_the_device_rule_catches_generated_text_and_scores():
    assert device_dependent('print(f"{out.prompt!r} -> {out.outputs[0].text!r}")') == ["out.outputs[0].text"]
    assert device_dependent('for s in beams: print(f"score {s.score:.3f}")') == ["s.score"]
    assert device_dependent("print(engine.tokenizer.decode([token]))") == ["engine.tokenizer.decode"]
    assert device_dependent("print(input_ids.tolist())") == ["input_ids"]
    # counts and comparisons are the same on every device
    assert device_dependent('print(len(o.token_ids), a.token_ids == b.token_ids, all(t.text for t in x))') == []
    assert device_dependent('print("identical:", mine.tokens == ref.tokens)') == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_checked_outputs_do_not_depend_on_the_device(path):
    bad = {}
    for i, cell in enumerate(_cells(path)):
        if cell.cell_type == "code" and cell.source.startswith("# NBVAL_CHECK_OUTPUT"):
            found = device_dependent(cell.source)
            if found:
                bad[f"cell {i}"] = found
    assert not bad, (f"{path.name}: NBVAL_CHECK_OUTPUT cells print values that change with the number format "
                     f"(print whether they are identical to the reference instead, or drop the marker): {bad}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_the_check_is_followed_by_working(path):
    cells = [c for c in _cells(path) if c.cell_type == "code"]
    at = next((i for i, c in enumerate(cells) if "course.check(" in c.source), None)
    homes = {m for f in (ROOT / "solutions").glob("ex[0-9][0-9]_*.py")
             for m in re.findall(r'^NOTEBOOK = "notebooks/([^"]+)"', f.read_text(), re.M)}
    if path.name not in homes:  # a notebook without an exercise of its own (08b)
        assert at is None, f"{path.name} checks an exercise that names another notebook as its home"
        return
    assert at is not None, f"{path.name} has no check cell"
    assert "ex = course.working(ex)" in cells[at + 1].source, (
        f"{path.name}: the cell after the check must be `ex = course.working(ex)`, so that the rest runs "
        "on the reference while the exercise is unsolved")


# --- answers and reveals ------------------------------------------------------------------------
ANSWER_CALL = re.compile(r"course\.answer\(\s*[\"']([^\"']+)[\"']")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_answers_are_asked_for_by_existing_keys_and_never_stored(path):
    known = answers.questions()
    for i, cell in enumerate(_cells(path)):
        if cell.cell_type != "code":
            continue
        for key in ANSWER_CALL.findall(cell.source):
            assert key in known, f"{path.name} cell {i} asks for an answer that does not exist: {key!r}"
            assert key.startswith(f"nb{path.name[:2]}."), f"{path.name} cell {i} shows another notebook's answer {key}"
            assert not cell.outputs, f"{path.name} cell {i}: an answer is stored (run scripts/run_notebooks.py)"


# --- no reference answer in what a notebook stores ----------------------------------------------
SOLUTION_MARKERS = ("BEGIN SOLUTION", "END SOLUTION")
# a module loaded from exercises/ or solutions/ (its code is an answer, or will be one)
EXERCISE_SOURCE = re.compile(r"getsource\(\s*(ex|reference|mine|yours|solution)\b")


def _line_pairs(lines) -> list[tuple[str, str]]:
    from minivllm.course.engine_parts import _significant, _squeeze

    significant = [x for x in (_squeeze(line) for line in lines) if _significant(x)]
    return list(zip(significant, significant[1:]))


def _answer_pairs() -> dict[tuple[str, str], str]:
    """Every two consecutive significant lines of every solution region, whitespace removed ->
    the solution file they come from; but for the lines minivllm's own code has too (a notebook
    shows minivllm's part beside the student's after the check: that is the engine, not an
    answer file, and ``tests/course/test_build_first.py`` keeps it out of sight until then)."""
    from minivllm.course import exgen

    engine = {pair for path in (ROOT / "minivllm").rglob("*.py") if "course" not in path.parts
              for pair in _line_pairs(path.read_text().splitlines())}
    pairs: dict[tuple[str, str], str] = {}
    for path in sorted((ROOT / "solutions").glob("ex[0-9][0-9]_*.py")):
        lines = path.read_text().splitlines()
        for region in exgen.find_regions("\n".join(lines), path.name):
            pairs.update((pair, path.name) for pair in _line_pairs(lines[region.begin + 1 : region.end])
                         if pair not in engine)
    return pairs


ANSWER_PAIRS = _answer_pairs()


def _stored_text(cell) -> str:
    if cell.cell_type == "markdown":
        return cell.source
    parts = []
    for out in cell.get("outputs", []):
        parts.append(out.get("text", ""))
        for value in out.get("data", {}).values():
            parts.append(value if isinstance(value, str) else "\n".join(value) if isinstance(value, list) else "")
    return "\n".join(parts)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_stored_output_holds_a_reference_answer(path):
    """What a student sees on opening a notebook (on GitHub, before running anything) holds no
    answer: a cell that prints an exercise's code does it through ``course.show_code``, whose
    output ``scripts/run_notebooks.py`` does not store, and no stored output or markdown cell
    holds a solution marker or two consecutive significant lines of a reference answer."""
    for i, cell in enumerate(_cells(path)):
        if cell.cell_type == "code":
            assert not EXERCISE_SOURCE.search(cell.source), (
                f"{path.name} cell {i} prints an exercise's code with getsource: use course.show_code, "
                "whose output is not stored")
            if "course.show_code(" in cell.source:
                assert not cell.outputs, f"{path.name} cell {i}: course.show_code's output is stored"
        text = _stored_text(cell)
        marker = next((m for m in SOLUTION_MARKERS if m in text), None)
        assert marker is None, f"{path.name} cell {i} stores a solution marker ({marker})"
        leaked = next((ANSWER_PAIRS[p] for p in _line_pairs(text.splitlines()) if p in ANSWER_PAIRS), None)
        assert leaked is None, f"{path.name} cell {i} stores lines of the reference answer in solutions/{leaked}"


def test_the_answer_rule_sees_an_answer():
    solution = (ROOT / "solutions" / "ex02_continuous.py").read_text()
    cell = nbformat.v4.new_code_cell("course.show_code(ex.ContinuousScheduler.schedule)")
    cell.outputs = [nbformat.v4.new_output("stream", text=solution)]
    assert any(p in ANSWER_PAIRS for p in _line_pairs(_stored_text(cell).splitlines()))
    assert "BEGIN SOLUTION" in _stored_text(cell)


def test_every_answer_is_asked_for_by_its_notebook():
    asked = {key for p in NOTEBOOKS for c in _cells(p) if c.cell_type == "code" for key in ANSWER_CALL.findall(c.source)}
    unused = sorted(set(answers.questions()) - asked)
    assert not unused, f"answers no notebook shows: {unused}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_revealing_cells_open_folded(path):
    """Folded as one ``<details>`` output (``course.folded``), or at least, until its cell is
    converted, in JupyterLab (``outputs_hidden``)."""
    for i, cell in enumerate(_cells(path)):
        if "reveal" in cell.metadata.get("tags", ()):
            assert cell.cell_type == "code", f"{path.name} cell {i}: only a code cell's output can be folded"
            folded = all(is_folded(out.get("data", {})) for out in cell.outputs)
            assert folded or cell.metadata.get("jupyter", {}).get("outputs_hidden") is True, (
                f"{path.name} cell {i} is tagged reveal but its output opens unfolded (run scripts/run_notebooks.py)")


# --- how a notebook opens -----------------------------------------------------------------------
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_it_opens_unchanged_in_jupyterlab(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata.get("kernelspec") == {"display_name": "Python 3 (ipykernel)", "language": "python",
                                             "name": "python3"}, "run scripts/run_notebooks.py"
    assert "widgets" not in nb.metadata
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", ()):
            data = out.get("data", {})
            assert "application/vnd.jupyter.widget-view+json" not in data, (
                f"{path.name} cell {i} stores a widget's view, which shows as its repr before the cell runs")
            assert not str(data.get("text/plain", "")).startswith(("VBox(", "HBox(", "interactive(")), (
                f"{path.name} cell {i} stores a widget's repr")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_lines_fit_the_page(path):
    long = []
    for i, cell in enumerate(_cells(path)):
        for line in cell.source.splitlines():
            prose_ok = line.lstrip().startswith("|") or "](http" in line or len(line) <= PROSE_WIDTH
            if cell.cell_type == "code" and len(line) > CODE_WIDTH:
                long.append(f"cell {i} code ({len(line)}): {line[:60]}")
            elif cell.cell_type == "markdown" and not prose_ok:
                long.append(f"cell {i} prose ({len(line)}): {line[:60]}")
        for out in cell.get("outputs", ()):
            text = out.get("text", "") if out.get("output_type") == "stream" else ""
            if is_folded(out.get("data", {})):  # what it prints, folded: the lines of its <pre> blocks
                page = "".join(out["data"]["text/html"])
                text = html.unescape("\n".join(re.findall(r"<pre>(.*?)</pre>", page, re.S)))
            for line in "".join(text).splitlines():
                if len(line) > OUTPUT_WIDTH:
                    long.append(f"cell {i} output ({len(line)}): {line[:60]}")
    assert not long, f"{path.name}: lines a notebook wraps in mid-word:\n" + "\n".join(long)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_tables_are_rendered_not_printed(path):
    for i, cell in enumerate(_cells(path)):
        for out in cell.get("outputs", ()):
            text = "".join(out.get("text", "")) if out.get("output_type") == "stream" else ""
            assert not re.search(r"^\|[-:| ]+\|$", text, re.M), (
                f"{path.name} cell {i} prints a Markdown table as text: show it with course.display.markdown")
