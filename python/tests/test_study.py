"""The study and the language model from Python: ffnlab.TransformerLM, ffnlab.train (the same
training as `ffnlab train`) and ffnlab.evolve (the same study as `ffnlab evolve`)."""
import csv
import inspect
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import ffnlab

REPO = pathlib.Path(__file__).resolve().parents[2]
# The command-line program beside the Python package of the same build (build/<preset>/python).
PROGRAM = pathlib.Path(ffnlab.__file__).resolve().parents[2] / "ffnlab"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """About 60 KB of real text: the project's own docs, fixed for the module."""
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("".join(p.read_text() for p in sorted((REPO / "docs").glob("*.md")))[:60000])
    return path


SMALL = dict(d_model=32, layers=2, heads=2, context=32)
SETTINGS = dict(steps=5, batch=4, seq=32, seed=1, warmup=1, eval_every=2, eval_tokens=256)


def test_transformer_lm_takes_a_variant_and_the_study_layer():
    lm = ffnlab.TransformerLM(variant="swiglu", **SMALL)
    assert lm.config["ffn"]["activation"] == "silu" and lm.config["ffn"]["kind"] == "glu"
    relu = ffnlab.TransformerLM(variant="relu", **SMALL)
    # A GLU's own width costs what ReLU's 4·d_model does: within 2 % of ReLU's parameters.
    assert abs(lm.num_params / relu.num_params - 1) < 0.02
    assert ffnlab.TransformerLM(variant="swiglu", d_ff=64, **SMALL).config["ffn"]["d_ff"] == 64
    assert "TransformerLM 2 layers d_model=32 ffn=swiglu" in repr(lm)
    # The study's layers hold ReLU's parameters (to within a step of 8 in width), MoE's too,
    # with the study's coefficients; the LM takes them as its FFN.
    relu_ffn = ffnlab.params(ffnlab.study_ffn("relu"))["params"]
    for variant in ("swiglu", "gated", "moe"):
        study = ffnlab.params(ffnlab.study_ffn(variant))["params"]
        assert abs(study / relu_ffn - 1) < 0.02, variant
    study_lm = ffnlab.TransformerLM(ffn=ffnlab.study_ffn("moe", 32), **SMALL)
    assert study_lm.config["ffn"] == ffnlab.study_ffn("moe", 32)
    moe = ffnlab.study_ffn("moe", d_model=32)
    assert (moe["moe"]["aux_coef"], moe["moe"]["z_coef"]) == pytest.approx((0.01, 1e-3))
    with pytest.raises(ValueError, match="heads"):
        ffnlab.TransformerLM(d_model=30, heads=4)
    with pytest.raises(ValueError):
        ffnlab.TransformerLM(variant="nope")
    for d_ff in (0, -5, 2.5):
        with pytest.raises(ValueError, match="d_ff must be a positive integer"):
            ffnlab.TransformerLM(variant="swiglu", d_ff=d_ff, **SMALL)
    with pytest.raises(ValueError, match="unknown variant 'nope'"):
        ffnlab.study_ffn("nope")
    with pytest.raises(ValueError, match=r"study_ffn: d_model must be an integer in \[1, "):
        ffnlab.study_ffn("relu", 0)


def test_params_is_the_command_lines_by_default():
    """ffnlab.params with no tokens costs what `ffnlab params` does (the same default tokens)."""
    cli = json.loads(subprocess.run([str(PROGRAM), "params", "--variants", "swiglu,moe", "--json"],
                                    check=True, capture_output=True, text=True).stdout)
    for row in cli["variants"]:
        python = ffnlab.params(row["config"])
        assert python["tokens"] == cli["tokens"]
        assert python["memory_bytes"] == row["memory_bytes"], row["variant"]
        assert python["params"] == row["params"], row["variant"]


def test_a_variant_is_the_same_model_in_python_and_on_the_command_line(tmp_path):
    """TransformerLM(variant=V[, d_ff=F][, objective=O]) is the model of `ffnlab train --variant V
    [--d-ff F] [--objective O]`: the same widths, MoE coefficients and objective keys, from one
    library function each."""
    cases = [(v, {}) for v in ffnlab.variant_names()] + [("moe", {"d_ff": 24}),
                                                         ("swiglu", {"objective": "masked"})]
    for variant, keys in cases:
        out = tmp_path / f"{variant}-{len(keys)}-{keys.get('d_ff')}"
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in keys.items()]
        subprocess.run([str(PROGRAM), "train", "--variant", variant, *flags, "--d-model", "32",
                        "--layers", "2", "--heads", "2", "--seq", "32", "--batch", "2",
                        "--steps", "1", "--sample", "0", "--threads", "1", "--out", str(out)],
                       check=True, capture_output=True)
        python = ffnlab.TransformerLM(variant=variant, **keys, **SMALL).config
        assert ffnlab.TransformerLM.from_run(out).config == python, (variant, keys)


def masked_log(path):
    """A CSV log's lines with its timing columns (tokens_per_s, seconds) blanked."""
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    timing = [i for i, c in enumerate(header) if c in ("tokens_per_s", "seconds")]
    out = [lines[0]]
    for line in lines[1:]:
        cells = line.split(",")
        for i in timing:
            cells[i] = "-"
        out.append(",".join(cells))
    return out


def masked_summary(summary):
    """summary.json with its timings blanked: the median tokens/s and the utilisation's rates."""
    out = dict(summary, median_tokens_per_second="-")
    if "utilisation" in out:
        out["utilisation"] = {key: "-" for key in out["utilisation"]}
    return out


def test_train_returns_its_logs_and_matches_the_command_line(corpus, tmp_path):
    lm = ffnlab.TransformerLM(variant="moe", seed=1, **SMALL)  # `train --seed` seeds both
    calls = []
    log = ffnlab.train(lm, corpus, progress=lambda *a: calls.append(a), **SETTINGS)
    assert [s["step"] for s in log["steps"]] == [1, 2, 3, 4, 5]
    assert [e["step"] for e in log["evals"]] == [2, 4, 5]
    assert 0 < log["validation"]["bits_per_byte"] < 9
    assert log["summary"]["parameters"] == lm.num_params and log["summary"]["steps"] == 5
    assert [c[0] for c in calls].count("step") == 5 and calls[-1][0] == "end"
    # Without a run folder nothing timed the bare products: no utilisation.
    assert "utilisation" not in log["summary"]
    # At the default eval_tokens the last step's evaluation read the whole validation part: it
    # is the validation, the value a fresh evaluation of the whole part gives (the same run with
    # a smaller eval_tokens evaluates it afresh; evaluations do not change the training).
    settings = {k: v for k, v in dict(SETTINGS, steps=2).items() if k != "eval_tokens"}
    whole = ffnlab.train(ffnlab.TransformerLM(seed=1, **SMALL), corpus, progress=False,
                         **settings)
    fresh = ffnlab.train(ffnlab.TransformerLM(seed=1, **SMALL), corpus, progress=False,
                         eval_tokens=64, **settings)
    assert whole["evals"][-1]["step"] == 2 and whole["validation"] == whole["evals"][-1]
    assert fresh["evals"][-1]["tokens"] < whole["validation"]["tokens"]
    assert fresh["validation"] == whole["validation"]

    # The same model and settings through `ffnlab train`.
    model = tmp_path / "model.json"
    model.write_text(json.dumps(ffnlab.TransformerLM(variant="moe", **SMALL).config))
    out = tmp_path / "cli"
    subprocess.run([str(PROGRAM), "train", "--model-config", str(model), "--data", str(corpus),
                    "--out", str(out), "--steps", "5", "--batch", "4", "--seq", "32",
                    "--seed", "1", "--warmup", "1", "--eval-every", "2", "--eval-tokens", "256",
                    "--sample", "0", "--threads", str(ffnlab.get_threads())],
                   check=True, capture_output=True)
    # Python's step dicts carry exactly the columns of the log (tokens_per_s is
    # tokens_per_second), with the same values.
    with open(out / "train_log.csv") as f:
        rows = list(csv.DictReader(f))
    columns = ["tokens_per_second" if c == "tokens_per_s" else c for c in rows[0]]
    assert list(log["steps"][0]) == columns
    assert [float(row["loss"]) for row in rows] == pytest.approx(
        [s["loss"] for s in log["steps"]], rel=0, abs=1e-6)

    # A new run into that folder is refused, in Python's words, and changes nothing in it.
    before = (out / "train_log.csv").read_text()
    with pytest.raises(ValueError, match=r"holds an earlier run \(a checkpoint at step 5\): "
                                         r"resume it \(resume=\), give another out, or pass "
                                         r"force=True to start over in it"):
        ffnlab.train(ffnlab.TransformerLM(variant="moe", seed=1, **SMALL), corpus, out=out,
                     progress=False, **SETTINGS)
    assert (out / "train_log.csv").read_text() == before

    # The same run into a folder writes what the command wrote, byte for byte but the timings:
    # the logs, and summary.json with its utilisation, measured the same way. The summary it
    # returns is the one it wrote.
    lm2 = ffnlab.TransformerLM(variant="moe", seed=1, **SMALL)
    py_out = tmp_path / "python"
    in_folder = ffnlab.train(lm2, corpus, out=py_out, progress=False, **SETTINGS)
    for name in ("train_log.csv", "eval_log.csv"):
        assert masked_log(py_out / name) == masked_log(out / name), name
    a = json.loads((out / "summary.json").read_text())
    b = json.loads((py_out / "summary.json").read_text())
    assert masked_summary(b) == masked_summary(a)
    assert b["utilisation"]["bare_products_gflops_per_second"] > 0
    assert in_folder["summary"] == b
    # Without a folder, the same summary but the utilisation.
    assert {k: v for k, v in masked_summary(log["summary"]).items()} == {
        k: v for k, v in masked_summary(b).items() if k != "utilisation"}


def test_train_diagnostics_per_layer(corpus, tmp_path):
    lm = ffnlab.TransformerLM(variant="moe", seed=1, **SMALL)
    log = ffnlab.train(lm, corpus, out=tmp_path / "run", progress=False,
                       **dict(SETTINGS, diagnostics_every=2))
    with_layers = [s["step"] for s in log["steps"] if "layers" in s]
    assert with_layers == [1, 2, 4]
    layer = log["steps"][0]["layers"][1]
    assert len(log["steps"][0]["layers"]) == SMALL["layers"]
    assert layer["grad_router"] > 0 and layer["router_logit_std"] > 0
    assert len(layer["expert_output_rms"]) == lm.config["ffn"]["moe"]["num_experts"]
    with open(tmp_path / "run" / "layer_log.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [1, 1, 2, 2, 4, 4]
    assert float(rows[1]["grad_router"]) == pytest.approx(layer["grad_router"], rel=1e-4)


def test_weights_and_batches_let_another_framework_train_the_same_run(corpus):
    lm = ffnlab.TransformerLM(variant="moe", seed=3, **SMALL)
    weights = lm.weights()
    assert "model.embed_tokens.weight" in weights and "model.layers.1.mlp.gate.weight" in weights
    total = 0
    for name, (shape, raw) in weights.items():
        count = 1
        for n in shape:
            count *= n
        assert len(raw) == 4 * count, name
        total += count
    assert total == lm.num_params
    assert weights == ffnlab.TransformerLM(variant="moe", seed=3, **SMALL).weights()
    assert weights != ffnlab.TransformerLM(variant="moe", seed=4, **SMALL).weights()

    batches = ffnlab.training_batches(corpus, 3, batch=4, seq=32, seed=1)
    assert len(batches) == 3 and all(len(i) == len(t) == 4 * 32 for i, t in batches)
    text = corpus.read_bytes()[: int(len(corpus.read_bytes()) * 0.9)]
    for ids, targets in batches:
        for row in range(4):
            window = ids[row * 32:(row + 1) * 32] + targets[(row + 1) * 32 - 1:(row + 1) * 32]
            assert targets[row * 32:(row + 1) * 32] == window[1:]  # the next bytes
            assert window in text  # a window of the training part
    assert batches == ffnlab.training_batches(corpus, 3, batch=4, seq=32, seed=1)
    assert batches != ffnlab.training_batches(corpus, 3, batch=4, seq=32, seed=2)
    with pytest.raises(ValueError):
        ffnlab.training_batches(corpus, 3, batch=0)


def test_train_stops_on_ctrl_c_after_the_current_step(corpus):
    lm = ffnlab.TransformerLM(**SMALL)
    seen = []

    def progress(kind, step, *rest):
        seen.append(step)
        if kind == "step" and step == 2:
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C would

    with pytest.raises(KeyboardInterrupt):
        ffnlab.train(lm, corpus, progress=progress, **dict(SETTINGS, steps=50))
    assert max(seen) <= 3
    # The stop request is forgotten: the next run goes through.
    assert len(ffnlab.train(lm, corpus, progress=False, **SETTINGS)["steps"]) == 5


def test_evolve_returns_results_json_and_writes_the_report(corpus, tmp_path):
    out = tmp_path / "report"
    kinds = set()
    results = ffnlab.evolve(out, quick=True, seeds=1, max_seeds=1, steps=4,
                            variants=["relu", "swiglu"], data=corpus,
                            progress=lambda kind, *a: kinds.add(kind))
    assert kinds >= {"begin", "message", "step", "end"}
    assert results == json.loads((out / "results.json").read_text())
    assert set(results["training"]["variants"]) == {"relu", "swiglu"}
    assert results["training"]["variants"]["relu"]["verdict"] == "reference"
    assert len(results["training"]["variants"]["swiglu"]["val_bits_per_byte"]) == 1
    assert results["costs"]["tutorial"]["relu"]["params"] == 2099712
    report = (out / "REPORT.md").read_text()
    assert report.startswith("# The evolution of the Transformer FFN, measured")
    assert "`ffnlab.evolve(quick=True, seeds=1, max_seeds=1, steps=4)`" in report
    assert (out / "training_dynamics.png").stat().st_size > 10000


def test_evolve_resume_takes_the_kept_runs_and_a_larger_study_reuses_them(corpus, tmp_path):
    def study(resume, max_seeds, runs=None):
        lines = []
        results = ffnlab.evolve(tmp_path / "report", quick=True, seeds=1, max_seeds=max_seeds,
                                steps=4, variants=["relu", "swiglu"], data=corpus, runs=runs,
                                resume=resume,
                                progress=lambda kind, done, planned, text, eta: lines.append(text))
        return results, sum("(kept in the run store)" in line for line in lines)

    first, kept = study(False, 1)
    assert kept == 0
    again, kept = study(True, 1)
    assert kept == 2  # relu and swiglu, seed 1: nothing trains
    for v in ("relu", "swiglu"):
        assert (again["training"]["variants"][v]["val_bits_per_byte"]
                == first["training"]["variants"][v]["val_bits_per_byte"])
    larger, kept = study(True, 3)  # the seeds the first study trained are taken, not trained
    assert kept == 2
    assert (larger["training"]["variants"]["relu"]["val_bits_per_byte"][0]
            == first["training"]["variants"]["relu"]["val_bits_per_byte"][0])
    assert (tmp_path / "report.runs" / ".ffnlab-runs").exists()
    assert "(resumed with `resume=True`, reusing 2 runs already trained)" in (
        tmp_path / "report" / "REPORT.md").read_text()
    _, kept = study(True, 1, runs=tmp_path / "elsewhere")
    assert kept == 0 and (tmp_path / "elsewhere" / ".ffnlab-runs").exists()
    # Nothing was taken: the report does not say it resumed.
    assert "resumed with" not in (tmp_path / "report" / "REPORT.md").read_text()


def test_evolve_across_sizes_and_tasks_and_within_a_budget(corpus, tmp_path):
    lines = []
    results = ffnlab.evolve(tmp_path / "report", quick=True, seeds=2, max_seeds=2, steps=4,
                            variants=["relu", "swiglu"], data=corpus, sizes=["xs", "s"],
                            tasks=("causal", "masked"),
                            progress=lambda kind, done, planned, text, eta: lines.append(text))
    scaling = results["scaling"]
    assert list(scaling["sizes"]) == ["xs", "s"]
    assert scaling["tasks"] == ["causal", "masked"]
    assert scaling["cells"]["s"]["causal"]["from_training_stage"]
    assert (scaling["cells"]["s"]["causal"]["variants"]["swiglu"]["val_bits_per_byte"]
            == results["training"]["variants"]["swiglu"]["val_bits_per_byte"])
    masked = scaling["cells"]["xs"]["masked"]["variants"]
    assert set(masked) == {"relu", "swiglu"} and len(masked["swiglu"]["val_bits_per_byte"]) == 2
    assert [(t["task"], t["variant"]) for t in scaling["trends"]] == [("causal", "swiglu"),
                                                                     ("masked", "swiglu")]
    assert (tmp_path / "report" / "scaling.png").stat().st_size > 10000
    assert any(line.startswith("  xs masked, look at 2 seeds") for line in lines)
    # A budget with the sizes given: the planner keeps them, chooses the seeds and steps, and
    # the report's first lines say what and why.
    results = ffnlab.evolve(tmp_path / "budget", quick=True, variants=["relu", "swiglu"],
                            data=corpus, sizes=["xs"], budget="1h", progress=False)
    assert list(results["scaling"]["sizes"]) == ["xs"]
    assert "chosen by `--budget`, for a budget of 60 min on 2 workers: sizes xs,s" in (
        tmp_path / "budget" / "REPORT.md").read_text()


def test_evolve_refuses_bad_sizes_tasks_and_budgets(tmp_path):
    for options, message in [(dict(sizes=["xs", "xxl"]), "size 'xxl' is not one of xs, s, m, l"),
                             (dict(sizes="xs,s"), "sizes must be a list of size names"),
                             (dict(sizes=[]), "sizes is empty"),
                             (dict(tasks=["masked", 1]), r"tasks\[1\] must be a task name"),
                             (dict(budget="soon"), "budget 'soon' is not a duration"),
                             (dict(budget=-5), "budget must be a number in"),
                             (dict(budget=1), "a budget of 1.0 s .* cannot hold the study")]:
        with pytest.raises(ValueError, match=message):
            ffnlab.evolve(tmp_path / "r", quick=True, progress=False, **options)
    # variants="all" is taken, as `--variants all` is: the next check is the one that refuses.
    with pytest.raises(ValueError, match="max seeds = 3 must not be below the seeds"):
        ffnlab.evolve(tmp_path / "r", variants="all", seeds=4, max_seeds=3, progress=False)
    assert not (tmp_path / "r").exists()


def test_evolve_full_adds_the_top2_moe_at_equal_compute_and_the_z_loss_ablation(corpus, tmp_path):
    def study(name, **full):
        return ffnlab.evolve(tmp_path / name, quick=True, seeds=1, max_seeds=1, steps=4,
                             variants=["relu", "moe"], data=corpus, progress=False, **full)
    default, full = study("default"), study("full", full=True)
    assert (default["full"], full["full"]) == (False, True)
    assert "moe_compute" not in default["moe_axes"]["rows"]
    assert "z_loss_ablation" not in default["moe"]
    assert set(full["moe_axes"]["rows"]) == {"relu", "moe", "moe_compute", "moe_fine_shared"}
    assert len(full["moe"]["z_loss_ablation"]["without_z_loss_val_bits_per_byte"]) == 1
    assert "`ffnlab.evolve(quick=True, full=True, seeds=1" in (tmp_path / "full" / "REPORT.md").read_text()


def test_evolve_interrupted_keeps_the_earlier_report(corpus, tmp_path):
    out = tmp_path / "report"
    ffnlab.evolve(out, quick=True, seeds=1, steps=2, variants=["relu"], data=corpus,
                  progress=False)
    before = (out / "results.json").read_text()
    # The store keeps that study's runs: another study there must say what becomes of them.
    kept = len(list((tmp_path / "report.runs").glob("*.cbor")))
    assert kept > 0
    with pytest.raises(ValueError, match=rf"keeps {kept} finished runs? of an earlier study: "
                                         r"resume=True takes .*; force=True discards them"):
        ffnlab.evolve(out, quick=True, seeds=1, steps=50, variants=["relu"], data=corpus,
                      progress=False)
    with pytest.raises(ValueError, match="force=True with resume=True: force=True discards"):
        ffnlab.evolve(out, quick=True, resume=True, force=True, progress=False)
    # A budgeted study cannot resume: the message says what can.
    with pytest.raises(ValueError, match="give what the budget chose .* with resume=True instead "
                                         "of the budget; force=True discards them"):
        ffnlab.evolve(out, quick=True, budget="1h", progress=False)
    assert len(list((tmp_path / "report.runs").glob("*.cbor"))) == kept

    def progress(kind, done, *rest):
        if kind == "step" and done == 1:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        ffnlab.evolve(out, quick=True, seeds=1, steps=50, variants=["relu"], data=corpus,
                      force=True, progress=progress)
    assert (out / "results.json").read_text() == before
    # No staging folder left; the run store beside the report is kept, emptied by force=True
    # (the interrupted run did not finish).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report", "report.runs"]
    assert not list((tmp_path / "report.runs").glob("*.cbor"))


# A gnuplot that writes its pid the first time it runs and then takes its time; each run then
# writes the figure it was asked for (a stand-in PNG), so that a study that does not stop goes on
# to its commit.
FAKE_GNUPLOT = """
import os, re, sys, time
pid_file = os.environ["FAKE_GNUPLOT_PID"]
if not os.path.exists(pid_file):
    with open(pid_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(pid_file + ".tmp", pid_file)
    time.sleep(20)
for name in re.findall(r"set output '([^']+)'", open(sys.argv[1]).read()):
    with open(name, "wb") as f:
        f.write(b"not a png")
"""

# The study in a child interpreter: what it raised, and whether a KeyboardInterrupt was still
# pending afterwards (a second one, at the next line).
EVOLVE_CHILD = """
import sys, ffnlab
try:
    ffnlab.evolve(sys.argv[1], quick=True, seeds=1, steps=2, variants=["relu"], data=sys.argv[2],
                  resume=True, progress=False)
    print("finished", flush=True)
except BaseException as e:
    print("raised", type(e).__name__, flush=True)
print("after", flush=True)
"""


def test_evolve_interrupted_while_drawing_figures_keeps_the_earlier_report(corpus, tmp_path):
    # Ctrl-C while gnuplot draws: no progress callback runs there, so only the library's stop
    # request, set by the signal itself, can stop the study before it replaces the report.
    out = tmp_path / "report"
    ffnlab.evolve(out, quick=True, seeds=1, steps=2, variants=["relu"], data=corpus,
                  progress=False)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert pathlib.Path("results.json") in before and pathlib.Path("REPORT.md") in before
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gnuplot = bin_dir / "gnuplot"
    gnuplot.write_text(f"#!{sys.executable}\n" + FAKE_GNUPLOT)
    gnuplot.chmod(0o755)
    pid_file = tmp_path / "gnuplot.pid"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               FAKE_GNUPLOT_PID=str(pid_file))
    child = subprocess.Popen([sys.executable, "-c", EVOLVE_CHILD, str(out), str(corpus)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not pid_file.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid_file.exists(), child.communicate(timeout=60)
        drawing = int(pid_file.read_text())
        t0 = time.monotonic()
        child.send_signal(signal.SIGINT)
        stdout, stderr = child.communicate(timeout=120)
        seconds = time.monotonic() - t0
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert stdout.split("\n")[:2] == ["raised KeyboardInterrupt", "after"], (stdout, stderr)
    assert child.returncode == 0, stderr
    assert seconds < 10, "the interrupt waited for gnuplot"
    with pytest.raises(ProcessLookupError):  # gnuplot was ended (and reaped), not left running
        os.kill(drawing, 0)
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before  # byte for byte: the earlier report is kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "gnuplot.pid", "report",
                                                          "report.runs"]


def test_evolve_takes_each_option_of_the_command_and_documents_it():
    # One argument per option row of the study (the rows `ffnlab evolve` makes its flags from).
    arguments = set(ffnlab._ffnlab._evolve_arguments())
    taken = set(inspect.signature(ffnlab.evolve).parameters) - {"progress"}
    assert taken == arguments
    for name in arguments:  # as the docstring introduces one: "name:" or `name`
        assert re.search(rf"(\b{name}:|`{name}`)", ffnlab.evolve.__doc__), name


def test_plan_is_the_commands_plan_as_data(tmp_path, monkeypatch):
    # evolve's arguments but those of its folders, and the core counts.
    taken = set(inspect.signature(ffnlab.plan).parameters)
    assert taken == set(ffnlab._ffnlab._evolve_arguments()) - {
        "out", "runs", "resume", "force"} | {"cores"}
    monkeypatch.chdir(tmp_path)
    p = ffnlab.plan(quick=True, cores=[1, 8, 64])
    assert os.listdir(tmp_path) == []  # nothing written
    assert p["arguments"] == {"sizes": None, "tasks": None, "seeds": 2, "max_seeds": 3,
                              "steps": 40}
    assert p["chosen"] == ""
    [size] = p["sizes"]
    assert (size["size"], size["d_model"], size["steps"]) == ("s", 32, 40)
    assert 0 < size["runs_first_look"] <= size["runs_at_cap"]
    assert 0 < size["relu_step_seconds"] < size["relu_run_seconds"]
    # This machine's threads first, then the core counts given (but that one).
    assert [w["cores"] for w in p["wall_seconds"]] == [ffnlab.get_threads(), 1, 8, 64]
    assert [w["this_machine"] for w in p["wall_seconds"]] == [True, False, False, False]
    for w in p["wall_seconds"]:
        assert p["other_seconds"] < w["first_look"] <= w["at_cap"]
    # More cores never take longer; one core takes the core-hours.
    by_cores = sorted(p["wall_seconds"], key=lambda w: w["cores"])
    walls = [w["at_cap"] for w in by_cores]
    assert walls == sorted(walls, reverse=True)
    assert by_cores[0]["cores"] == 1
    assert by_cores[0]["at_cap"] == pytest.approx(p["core_hours"]["at_cap"] * 3600, rel=1e-9)
    assert by_cores[0]["first_look"] == pytest.approx(p["core_hours"]["first_look"] * 3600,
                                                      rel=1e-9)
    # seeds=1: the study trains a second seed before its first look; its arguments keep 1.
    one_seed = ffnlab.plan(quick=True, seeds=1)
    assert one_seed["arguments"]["seeds"] == 1
    assert "2 to 3 seeds" in one_seed["text"]
    # The text is the command's, its numbers the dict's.
    assert f"{p['core_hours']['first_look']:.2f} core-hours" in p["text"]
    command = subprocess.run([str(PROGRAM), "evolve", "--quick", "--plan", "--plan-cores", "8,64"],
                             check=True, capture_output=True, text=True).stdout
    line = "The study as planned: sizes s, 2 to 3 seeds, 40 steps, tasks causal."
    assert line in command and p["text"].startswith(line)
    runs = f"| {size['runs_first_look']} to {size['runs_at_cap']} |"
    assert runs in command and runs in p["text"]
    # A budget: what it chose, as arguments evolve takes.
    chosen = ffnlab.plan(quick=True, budget="1h")
    assert chosen["chosen"].startswith("a budget of 60 min on ")
    assert chosen["text"].startswith("chosen for " + chosen["chosen"])
    # (None: the study's LM alone, which a slow machine's budget may choose)
    assert (chosen["arguments"]["sizes"] or ["s"]) == [s["size"] for s in chosen["sizes"]]
    with pytest.raises(ValueError, match="cannot hold the study"):
        ffnlab.plan(quick=True, budget=1)
    # Ctrl-C stops it after the size it is timing: the whole ladder's timing (about 15 s on 2
    # cores of a Zen 5) is not waited for.
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt, match="the plan stopped while it timed the sizes"):
        ffnlab.plan(budget="1h")
    timer.join()
    assert time.monotonic() - started < 6
    # Bad arguments: one-line ValueErrors naming them, before any timing.
    for arguments, message in (
            (dict(cores=[0]), r"plan: cores\[0\] must be an integer in \[1, 10000000\]"),
            (dict(cores="8"), r"plan: cores must be a list of core counts"),
            (dict(seeds=0), r"plan: seeds must be an integer in \[1, 1000\]"),
            (dict(variants=[]), r"plan: variants is empty"),
            (dict(variants=["gelu"]), "must include relu")):
        with pytest.raises(ValueError, match=message):
            ffnlab.plan(quick=True, **arguments)


def test_evolve_names_its_out_argument_in_pythons_words(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"\[report\] out '\.' is or contains the current "
                                         r"directory .* e\.g\. out='report'"):
        ffnlab.evolve(".", quick=True, progress=False)


def test_evolve_refuses_bad_options_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="must include relu"):
        ffnlab.evolve(tmp_path / "r", variants=["gelu"], progress=False)
    with pytest.raises(ValueError, match="no option"):
        ffnlab._ffnlab._evolve({"colour": "blue"})
    with pytest.raises(ValueError, match="routing seeds = 3 must not exceed seeds = 2"):
        ffnlab.evolve(tmp_path / "r", quick=True, routing_seeds=3, progress=False)
    assert not (tmp_path / "r").exists()


def test_train_writes_a_run_folder_and_resumes_bit_identically(corpus, tmp_path):
    whole = ffnlab.train(ffnlab.TransformerLM(seed=1, **SMALL), corpus, progress=False,
                         **dict(SETTINGS, steps=6))
    run = tmp_path / "run"
    first = ffnlab.train(ffnlab.TransformerLM(seed=1, **SMALL), corpus, out=run, progress=False,
                         **dict(SETTINGS, steps=6, checkpoint_every=3))
    assert (run / "checkpoint" / "checkpoint.json").exists()
    assert json.loads((run / "summary.json").read_text())["steps"] == 6
    with open(run / "train_log.csv") as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == [1, 2, 3, 4, 5, 6]
    assert [s["loss"] for s in first["steps"]] == [s["loss"] for s in whole["steps"]]

    # Stopped by Ctrl-C after step 3 (a checkpoint is written), then resumed: steps 4 to 6 have
    # the losses of the uninterrupted run.
    part = tmp_path / "part"

    def interrupt_at_3(kind, step, *rest):
        if kind == "step" and step == 3:
            os.kill(os.getpid(), signal.SIGINT)

    # The KeyboardInterrupt says where the run stopped and where its checkpoint is.
    with pytest.raises(KeyboardInterrupt, match="stopped after step 3; checkpoint written to"):
        ffnlab.train(ffnlab.TransformerLM(seed=1, **SMALL), corpus, out=part,
                     progress=interrupt_at_3, **dict(SETTINGS, steps=6))
    # Without a folder the steps so far are not lost either: the exception carries them.
    with pytest.raises(KeyboardInterrupt, match="stopped after step 3$") as stopped:
        ffnlab.train(ffnlab.TransformerLM(seed=1, **SMALL), corpus, progress=interrupt_at_3,
                     **dict(SETTINGS, steps=6))
    assert [s["step"] for s in stopped.value.log["steps"]] == [1, 2, 3]
    assert [s["loss"] for s in stopped.value.log["steps"]] == \
        [s["loss"] for s in whole["steps"][:3]]
    assert json.loads((part / "checkpoint" / "checkpoint.json").read_text())["step"] == 3
    lm = ffnlab.TransformerLM.from_run(part)
    assert lm.config == ffnlab.TransformerLM(**SMALL).config
    rest = ffnlab.train(lm, corpus, out=part, resume=part, progress=False,
                        **dict(SETTINGS, steps=6))
    assert [s["step"] for s in rest["steps"]] == [4, 5, 6]
    assert [s["loss"] for s in rest["steps"]] == [s["loss"] for s in whole["steps"][3:]]
    with open(part / "train_log.csv") as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == [1, 2, 3, 4, 5, 6]

    # Extended past its length, the cosine schedule gave the steps it trained other rates than
    # an 8-step run's: warned, as `ffnlab train` notes it.
    with pytest.warns(UserWarning, match=r"\[train\] the checkpoint's 6 steps followed a 6-step "
                                         r"cosine schedule, which from step 3 on"):
        ffnlab.train(ffnlab.TransformerLM.from_run(part), corpus, resume=part,
                     out=tmp_path / "longer", progress=False, steps=8)

    # Other settings, or other data, only when forced.
    with pytest.raises(ValueError, match="lr"):
        ffnlab.train(ffnlab.TransformerLM.from_run(part), corpus, resume=part, progress=False,
                     steps=8, lr=0.1)
    other = tmp_path / "other.txt"
    other.write_text(corpus.read_text()[::-1])
    with pytest.raises(ValueError, match="not the data"):
        ffnlab.train(ffnlab.TransformerLM.from_run(part), other, resume=part, progress=False,
                     steps=8)
    with pytest.raises(ValueError, match="inside the data"):
        ffnlab.train(ffnlab.TransformerLM(**SMALL), tmp_path, out=tmp_path / "x", progress=False,
                     **SETTINGS)


def test_a_failing_progress_callback_stops_the_work_and_is_raised_as_it_was(corpus):
    class Boom(Exception):
        pass

    def progress(kind, step, *rest):
        if kind == "step" and step == 2:
            raise Boom("from the callback")

    with pytest.raises(Boom, match="from the callback"):
        ffnlab.train(ffnlab.TransformerLM(**SMALL), corpus, progress=progress,
                     **dict(SETTINGS, steps=50))
    # The stop request it made is forgotten.
    assert len(ffnlab.train(ffnlab.TransformerLM(**SMALL), corpus, progress=False,
                            **SETTINGS)["steps"]) == 5


def test_a_sigint_handlers_own_exception_is_raised_as_it_is(corpus):
    class Stop(Exception):
        pass

    def handler(signum, frame):
        raise Stop("the program's own handler")

    def progress(kind, step, *rest):
        if kind == "step" and step == 2:
            os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        with pytest.raises(Stop, match="own handler"):
            ffnlab.train(ffnlab.TransformerLM(**SMALL), corpus, progress=progress,
                         **dict(SETTINGS, steps=50))
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_after_the_last_step_is_not_lost(corpus):
    def progress(kind, *rest):
        if kind == "end":
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        ffnlab.train(ffnlab.TransformerLM(**SMALL), corpus, progress=progress, **SETTINGS)


def test_resume_from_python_splits_the_data_as_the_command_did(corpus, tmp_path):
    run = tmp_path / "run"
    model = tmp_path / "model.json"
    model.write_text(json.dumps(ffnlab.TransformerLM(**SMALL).config))
    subprocess.run([str(PROGRAM), "train", "--model-config", str(model), "--data", str(corpus),
                    "--out", str(run), "--steps", "3", "--batch", "4", "--seq", "32",
                    "--val-fraction", "0.2", "--eval-tokens", "256", "--threads",
                    str(ffnlab.get_threads())],
                   check=True, capture_output=True)
    # val_fraction= is --val-fraction: a new run at 0.2 is the command's run.
    fresh = ffnlab.train(ffnlab.TransformerLM(**SMALL), corpus, progress=False, steps=3, batch=4,
                         seq=32, eval_tokens=256, val_fraction=0.2)
    data = fresh["summary"]["data"]
    assert data["validation_bytes"] == data["bytes"] - int(data["bytes"] * (1 - 0.2))
    command = json.loads((run / "summary.json").read_text())
    assert masked_summary(fresh["summary"]) == dict(  # (the command drew a sample; train() none)
        {k: v for k, v in masked_summary(command).items() if k != "utilisation"}, sample="")
    # Another split of a resumed run's bytes is refused in Python's words, and taken with force.
    with pytest.raises(ValueError, match=r"\(another val_fraction=\?\); pass force=True"):
        ffnlab.train(ffnlab.TransformerLM.from_run(run), corpus, resume=run, out=tmp_path / "other",
                     progress=False, steps=4, val_fraction=0.3)
    forced = ffnlab.train(ffnlab.TransformerLM.from_run(run), corpus, resume=run,
                          out=tmp_path / "other", progress=False, steps=4, val_fraction=0.3,
                          force=True)
    assert forced["summary"]["data"]["validation_bytes"] > data["validation_bytes"]
    for bad in (0, 1, 1.5, -0.1, True, "0.2", float("nan")):
        with pytest.raises(ValueError, match=r"train: val_fraction must be a number in \(0, 1\)"):
            ffnlab.train(ffnlab.TransformerLM(**SMALL), corpus, progress=False, steps=1,
                         val_fraction=bad)
    # None: the resumed run's split.
    log = ffnlab.train(ffnlab.TransformerLM.from_run(run), corpus, resume=run, progress=False,
                       steps=5)
    assert [s["step"] for s in log["steps"]] == [4, 5]
    assert log["summary"]["steps"] == 5
    assert json.loads((run / "summary.json").read_text())["steps"] == 5  # continued in `run`


def test_sample_continues_a_prompt_as_the_command_does(corpus, tmp_path):
    lm = ffnlab.TransformerLM(seed=1, **SMALL)
    ffnlab.train(lm, corpus, progress=False, **SETTINGS)
    model = tmp_path / "model.json"
    model.write_text(json.dumps(lm.config))
    out = tmp_path / "cli"
    subprocess.run([str(PROGRAM), "train", "--model-config", str(model), "--data", str(corpus),
                    "--out", str(out), "--steps", "5", "--batch", "4", "--seq", "32",
                    "--seed", "1", "--warmup", "1", "--eval-every", "2", "--eval-tokens", "256",
                    "--sample", "64", "--prompt", "The ", "--temperature", "0.5",
                    "--threads", str(ffnlab.get_threads())],
                   check=True, capture_output=True)
    want = (out / "sample.txt").read_bytes()
    assert len(want) == 64
    # The trained model's sample at the run's seed is the command's, byte for byte.
    text = lm.sample(64, prompt="The ", temperature=0.5, seed=1)
    assert text == want.decode("utf-8", "replace")
    assert lm.sample(64, prompt=b"The ", temperature=0.5, seed=1) == text
    assert lm.sample(64, prompt="The ", temperature=0.5, seed=2) != text
    # Greedy draws nothing at random; the defaults are --sample's.
    assert lm.sample(32, temperature=0, seed=1) == lm.sample(32, temperature=0, seed=7)
    assert lm.sample() == lm.sample(300, prompt="\n", temperature=0.8, seed=1)
    assert lm.sample(0) == ""
    for name, bad, message in (
            ("n", -1, r"sample: n must be an integer in \[0, 1000000\]"),
            ("n", 2.0, "sample: n must be an integer"),
            ("temperature", -0.5, r"sample: temperature must be a number in \[0, 1000\] "
                                  r"\(0: greedy\)"),
            ("temperature", float("inf"), "sample: temperature must be a number"),
            ("prompt", 5, "sample: prompt must be a str or bytes"),
            ("seed", -1, r"sample: seed must be an integer in \[0, 2\^64")):
        with pytest.raises(ValueError, match=message):
            lm.sample(**{name: bad})
    with pytest.raises(ValueError, match="the prompt holds byte 200, outside vocab = 100"):
        ffnlab.TransformerLM(vocab=100, **SMALL).sample(4, prompt=b"\xc8")
    masked = ffnlab.TransformerLM(objective="masked", **SMALL)
    with pytest.raises(ValueError, match="bidirectional model"):
        masked.sample(4)
    # Ctrl-C stops a long sample at once (a million bytes would take minutes), and the next
    # sample goes through.
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        lm.sample(1000000)
    timer.join()
    assert time.monotonic() - started < 20
    assert lm.sample(32, temperature=0, seed=1) == lm.sample(32, temperature=0, seed=7)


def test_toy_is_the_commands_toy_run(tmp_path):
    out = tmp_path / "toy.csv"
    subprocess.run([str(PROGRAM), "toy", "--variants", "relu,swiglu,moe", "--iterations", "6",
                    "--seed", "7", "--out", str(out), "--threads", str(ffnlab.get_threads())],
                   check=True, capture_output=True)
    with open(out) as f:
        rows = list(csv.DictReader(f))
    for variant in ("relu", "swiglu", "moe"):
        log = ffnlab.toy(variant=variant, iterations=6, seed=7)
        assert [s["iteration"] for s in log] == [1, 2, 3, 4, 5, 6]
        command = [r for r in rows if r["variant"] == variant]
        # The command writes six decimals.
        assert [s["loss"] for s in log] == pytest.approx(
            [float(r["loss"]) for r in command], rel=0, abs=1e-6), variant
        assert [s["grad_norm"] for s in log] == pytest.approx(
            [float(r["grad_norm"]) for r in command], rel=0, abs=1e-6), variant
    # The tutorial's defaults: ReLU's loss falls by 99 % in 100 iterations (the tutorial: 1.05 to
    # 0.0075); another seed draws another run.
    relu = ffnlab.toy()
    assert len(relu) == 100 and relu[-1]["loss"] < 0.01 * relu[0]["loss"]
    assert ffnlab.toy(seed=1, iterations=2) != relu[:2]
    for arguments, message in ((dict(batch=0), r"toy: batch must be an integer in \[1, "),
                               (dict(dropout=1.0), r"toy: dropout must be a number in \[0, 1\)"),
                               (dict(lr=0), r"toy: lr must be a number in \(0, 1e\+30\], got 0"),
                               # In single precision too, as the CLI's flags check them.
                               (dict(dropout=0.99999999),
                                r"toy: dropout must be a number in \[0, 1\) .*got 0.99999999"),
                               (dict(lr=1e-50), r"toy: lr must be a number in \(0, 1e\+30\]"),
                               (dict(iterations=2.5), "toy: iterations must be an integer"),
                               (dict(d_model=-1), "d_model")):
        with pytest.raises(ValueError, match=message):
            ffnlab.toy(**arguments)
    with pytest.raises(TypeError):
        ffnlab.toy(None, 2)  # the settings are keywords
    # Progress: a "step" after each iteration with its loss, then "end".
    calls = []
    log = ffnlab.toy(iterations=3, progress=lambda *call: calls.append(call))
    assert [c[:3] for c in calls] == [("step", 1, 3), ("step", 2, 3), ("step", 3, 3),
                                      ("end", 3, 3)], calls
    assert calls[0][3] == f"loss {log[0]['loss']:.4f}" and calls[2][4] == 0, calls
    with pytest.raises(ValueError, match="toy: progress must be True, False, None or a callable"):
        ffnlab.toy(progress="yes")


def test_a_text_bar_ends_its_line_when_the_work_fails(capsys):
    # A learning rate of 1e30 makes the second iteration's loss infinite: the run fails after the
    # bar was drawn, and the error is not written at the end of the bar's line.
    with pytest.raises(ValueError, match="is not finite"):
        ffnlab.toy(lr=1e30, iterations=5, progress=True)
    out = capsys.readouterr().out
    assert out.startswith("\r[") and out.endswith("\n"), repr(out)


def test_a_progress_callback_cannot_start_another_run(corpus):
    lm = ffnlab.TransformerLM(**SMALL)

    def progress(kind, *rest):
        if kind == "step":
            lm.sample(4)  # they share the process's stop request

    with pytest.raises(ValueError, match="cannot be called from the progress callback of "
                                         "another"):
        ffnlab.train(lm, corpus, progress=progress, **SETTINGS)
    assert lm.sample(4, temperature=0) == lm.sample(4, temperature=0, seed=9)  # after it: fine


def test_evolve_refuses_a_variant_listed_twice(tmp_path):
    with pytest.raises(ValueError, match="listed twice"):
        ffnlab.evolve(tmp_path / "r", variants=["relu", "swiglu", "swiglu"], progress=False)


def test_masked_objective_trains_a_bidirectional_model(corpus):
    lm = ffnlab.TransformerLM(variant="relu", objective="masked", seed=1, **SMALL)
    # The keys `ffnlab train --objective masked` sets: bidirectional, [MASK], RoPE unless given.
    assert (lm.config["causal"], lm.config["vocab"], lm.config["positions"]) == (False, 257, "rope")
    learned = ffnlab.TransformerLM(objective="masked", positions="learned", **SMALL)
    assert learned.config["positions"] == "learned"
    assert ffnlab.TransformerLM(objective="causal", **SMALL).config == ffnlab.TransformerLM(
        **SMALL).config
    with pytest.raises(ValueError, match="unknown objective 'bert'"):
        ffnlab.TransformerLM(objective="bert", **SMALL)
    # Bad arguments are one-line ValueErrors naming them, as evolve's and train's are.
    with pytest.raises(ValueError, match=r"TransformerLM: seed must be an integer in \[0, 2\^64"):
        ffnlab.TransformerLM(seed=-1, **SMALL)
    with pytest.raises(ValueError, match="from_run: run_dir must be a path"):
        ffnlab.TransformerLM.from_run(5)
    with pytest.raises(ValueError, match="training_batches: seed must be an integer"):
        ffnlab.training_batches(corpus, 1, seed=True)
    # A misspelt key: the config's keys are listed, and this call's own beside them.
    with pytest.raises(ValueError, match=r"unknown key 'objectve' \(known: .*\); TransformerLM "
                                         "also takes variant, d_ff and objective"):
        ffnlab.TransformerLM(objectve="masked", **SMALL)
    with pytest.raises(ValueError) as nested:  # a key of the FFN's: not TransformerLM's to name
        ffnlab.TransformerLM(ffn={"variant": "relu", "bogus": 1}, **SMALL)
    assert "unknown key 'bogus'" in str(nested.value)
    assert "TransformerLM also takes" not in str(nested.value)
    with pytest.raises(ValueError, match="training_batches: steps must be an integer"):
        ffnlab.training_batches(corpus, True)
    # Keys given beside it are kept; a causal model is not made bidirectional behind one's back.
    assert ffnlab.TransformerLM(objective="masked", vocab=300, **SMALL).config["vocab"] == 300
    with pytest.raises(ValueError, match="trains a bidirectional model, not one with causal true"):
        ffnlab.TransformerLM(ffnlab.TransformerLM(**SMALL).config, objective="masked")
    log = ffnlab.train(lm, corpus, objective="masked", mask_fraction=0.25, progress=False,
                       **SETTINGS)
    # Bits per masked byte: 8 of each window's 32 bytes (eval_tokens 256: 8 windows).
    assert log["evals"][0]["tokens"] == 8 * (256 // 32)
    assert log["validation"]["tokens"] % 8 == 0
    assert 3 < log["validation"]["bits_per_byte"] < 9
    causal = ffnlab.TransformerLM(variant="relu", vocab=257, **SMALL)
    with pytest.raises(ValueError, match="bidirectional"):
        ffnlab.train(causal, corpus, objective="masked", progress=False, **SETTINGS)
    encoder = ffnlab.TransformerLM(variant="relu", causal=False, vocab=257, **SMALL)
    with pytest.raises(ValueError, match="--objective masked"):
        ffnlab.train(encoder, corpus, progress=False, **SETTINGS)
