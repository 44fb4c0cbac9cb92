"""examples/FFN_Evolution.ipynb runs top to bottom (headless, its quick settings), so that it
cannot rot: every cell executes without error and the study's cell prints every variant."""
import pathlib

import nbclient  # python3-nbclient, python3-ipykernel (scripts/install-deps.sh)
import nbformat

import ffnlab

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "examples" / "FFN_Evolution.ipynb"


def test_the_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.txt"
    docs = sorted((NOTEBOOK.parents[1] / "docs").glob("*.md"))
    corpus.write_text("".join(p.read_text() for p in docs)[:80000])
    # The kernel inherits the environment: the built package (PYTHONPATH), quick settings, a
    # small corpus, and matplotlib without a display.
    monkeypatch.setenv("PYTHONPATH", str(pathlib.Path(ffnlab.__file__).resolve().parents[1]))
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # ipykernel's debugger note
    monkeypatch.setenv("FFNLAB_NOTEBOOK_QUICK", "1")
    monkeypatch.setenv("FFNLAB_DATA", str(corpus))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    text = "\n".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                     for out in cell.outputs)
    for variant in ("relu", "swiglu", "moe"):  # the study cell's lines: mean ± std and verdict
        assert f"\n{variant:10} " in "\n" + text and " bits/byte   " in text, variant
    assert "reference" in text and "best at equal parameters:" in text
    assert "validation:" in text and "bits/byte" in text
    assert (tmp_path / "ffn_evolution_report" / "REPORT.md").exists()
    # The ladder's cell: a trend line per task and variant, and its report.
    for line in ("causal  swiglu", "masked  gelu"):
        assert line in text, line
    assert (tmp_path / "ffn_scaling_report" / "scaling.png").exists()


def test_the_committed_notebook_holds_its_outputs_and_figures():
    """A reader who opens the notebook in a viewer sees what it computes: it is committed
    executed, by scripts/execute_notebook.py."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(cell.get("execution_count") for cell in code), \
        "run scripts/execute_notebook.py: a code cell was never executed"
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), \
        "the cells ran out of order"
    figures = [cell for cell in code if "plt.show()" in cell.source]
    assert figures
    for cell in figures:
        assert any("image/png" in out.get("data", {}) for out in cell.outputs), cell.source[:60]
    assert not any(out.get("output_type") == "error" for cell in code for out in cell.outputs)
