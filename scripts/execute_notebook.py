#!/usr/bin/env python3
"""Executes examples/FFN_Evolution.ipynb top to bottom and writes it back with its outputs and
figures, so that a reader who opens it in a viewer sees what it computes.

    PYTHONPATH=build/release/python /usr/bin/python3 scripts/execute_notebook.py [--data PATH]

The notebook runs with its quick settings (FFNLAB_NOTEBOOK_QUICK=1, its own default) on the
Debian fortunes corpus unless --data says otherwise, in a temporary folder, so its reports do not
land in the repository. The test suite executes the notebook again headless (python/tests/
test_notebook.py) and checks that the committed copy holds every output.

Needs nbclient, nbformat, ipykernel and matplotlib (scripts/install-deps.sh test). A failure is
one line on stderr and exit status 1; the notebook is then left as it was.
"""
import argparse
import os
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "FFN_Evolution.ipynb"


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="/usr/share/games/fortunes",
                        help="the text the notebook trains on (a file or a folder)")
    args = parser.parse_args(argv)
    try:
        import nbclient
        import nbformat
        import ffnlab  # the kernel imports the same package: its folder goes on PYTHONPATH
    except ImportError as e:
        print(f"execute_notebook: {e} (run with PYTHONPATH=build/release/python "
              f"/usr/bin/python3)", file=sys.stderr)
        return 1
    env = {
        "PYTHONPATH": str(pathlib.Path(ffnlab.__file__).resolve().parents[1]),
        "FFNLAB_NOTEBOOK_QUICK": "1",
        "FFNLAB_DATA": args.data,
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    }
    os.environ.update(env)
    os.environ.pop("MPLBACKEND", None)  # the kernel's inline backend keeps each figure
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for i, cell in enumerate(nb.cells):  # stable ids: the file changes only where outputs do
        cell["id"] = f"cell-{i}"
    with tempfile.TemporaryDirectory(prefix="ffnlab-notebook-") as work:
        client = nbclient.NotebookClient(nb, timeout=1200, kernel_name="python3",
                                         resources={"metadata": {"path": work}})
        try:
            client.execute()
        except Exception as e:  # nbclient raises CellExecutionError and kernel errors
            first = str(e).strip().splitlines()
            print(f"execute_notebook: the notebook failed: {first[-1] if first else e}",
                  file=sys.stderr)
            return 1
    # One output per stream and cell (the study prints its progress line by line), and the
    # temporary folder's paths shown relative: they would differ on every run.
    for cell in nb.cells:
        merged = []
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = out["text"].replace(work + "/", "")
            if (merged and out.get("output_type") == "stream"
                    and merged[-1].get("output_type") == "stream"
                    and merged[-1]["name"] == out["name"]):
                merged[-1]["text"] += out["text"]
            else:
                merged.append(out)
        if "outputs" in cell:
            cell["outputs"] = merged
    partial = NOTEBOOK.with_suffix(".ipynb.partial")
    nbformat.write(nb, partial)
    os.replace(partial, NOTEBOOK)
    print(f"execute_notebook: wrote {NOTEBOOK.relative_to(ROOT)} with its outputs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
