"""examples/FFN_Evolution.ipynb runs top to bottom (headless, its quick settings), so that it
cannot rot: every cell executes without error, the cost cell prints the tutorial's parameter
counts, and the study's cell prints a line per variant."""
import pathlib
import re

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

    def output_of(marker):  # the text of the one code cell whose source holds `marker`
        cells = [cell for cell in nb.cells if cell.cell_type == "code" and marker in cell.source]
        assert len(cells) == 1, marker
        return "".join(out.get("text", "") for out in cells[0].outputs)

    text = "\n".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                     for out in cell.outputs)
    # The tutorial's configuration (d_model 512, d_ff 2048, biases): its parameter counts, and
    # MoE top-2 at twice ReLU's forward work.
    costs = output_of("ffnlab.params(")
    for variant, params in (("relu", "2,099,712"), ("glu", "3,150,336"), ("gated", "9,454,080"),
                            ("moe", "16,801,800")):
        assert re.search(rf"^{variant} +{params} ", costs, re.M), (variant, costs)
    assert re.search(r"^moe .* 2\.00 +\d", costs, re.M), costs
    # The study cell: one line per default variant with its width, mean ± std and verdict.
    study = output_of('ffnlab.evolve("ffn_evolution_report"')
    for variant in ("relu", "gelu", "glu", "swiglu", "gated", "moe"):
        assert re.search(rf"^{variant} +d_ff +\d+ +[\d,]+ params +\d\.\d{{4}} ± \d\.\d{{4}} "
                         r"bits/byte +(reference|better|worse|equivalent|inconclusive)",
                         study, re.M), (variant, study[-2000:])
    assert re.search(r"^relu .* reference$", study, re.M)
    assert "best at equal parameters:" in text
    # Sparsity and expert load: a row per variant, a line per balancing setting.
    assert re.search(r"^relu +\d+\.\d% +\d+\.\d% +\d+ of \d+$", output_of('"sparsity"'), re.M)
    for setting in ("none", "loss", "bias"):
        assert f"MoE, balancing {setting:4}: load CV" in text, setting
    assert "validation:" in text and "bits/byte" in text
    assert (tmp_path / "ffn_evolution_report" / "REPORT.md").exists()
    # The ladder's cell: a trend line per task and variant, and its report.
    for line in ("causal  swiglu", "masked  gelu"):
        assert line in text, line
    # The plan before the study, and the trained LM's sample.
    assert re.search(r"^\d+ (s|min)( to \d+ (s|min))? on this machine's \d+ threads "
                     r"\(\d+\.\d\d core-hours at most\)$", output_of("ffnlab.plan("), re.M)
    # 300 bytes as text: fewer characters where they make multi-byte characters.
    assert 100 <= len(output_of("lm.sample(")) <= 301
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
    figures = [cell for cell in code if "plt.subplots(" in cell.source]
    assert figures and all("plt.show()" in cell.source for cell in figures)
    for cell in figures:
        assert any("image/png" in out.get("data", {}) for out in cell.outputs), cell.source[:60]
    assert not any(out.get("output_type") == "error" for cell in code for out in cell.outputs)
    # Outputs of the current code: what the study prints from Python names Python's arguments,
    # never the command line's flags.
    text = "".join(out.get("text", "") for cell in code for out in cell.outputs)
    assert not re.search(r"--[a-z]", text), re.search(r".*--[a-z].*", text).group(0)
