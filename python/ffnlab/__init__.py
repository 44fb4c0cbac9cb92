"""ffnlab's FFN and Mixture-of-Experts layers from Python (docs/python.md).

    import numpy as np, ffnlab
    layer = ffnlab.FFN(variant="swiglu", d_model=512, d_ff=1376, bias=False)
    y = layer.forward(np.random.rand(8, 512).astype(np.float32), train=True)
    dx = layer.backward(np.ones_like(y))
    layer.grads()["down_proj.weight"]  # a numpy view of the gradient

The FFN-evolution study and the byte-level language model:

    results = ffnlab.evolve(out="report", quick=True)   # REPORT.md, APPENDIX.md, results.json
    lm = ffnlab.TransformerLM(variant="swiglu", d_model=64, layers=2, heads=2, context=64)
    log = ffnlab.train(lm, data="corpus.txt", steps=100, batch=8, seq=64)

ffnlab.torch wraps a layer as a torch.nn.Module (imported on demand: it needs torch).
"""
from . import _ffnlab
from ._ffnlab import (FFN, TransformerLM, __version__, activation_names, config, from_hf,
                      get_conv_min_rows, get_huge_page_min_bytes, get_threads,
                      get_weight_packing_min_rows, params, set_conv_min_rows,
                      set_huge_page_min_bytes, set_threads, set_weight_packing_min_rows,
                      study_ffn, training_batches, variant_names, zoo)
from .progress import TextProgress

__all__ = ["FFN", "TransformerLM", "TextProgress", "__version__", "activation_names", "config",
           "evolve", "from_hf", "get_conv_min_rows", "get_huge_page_min_bytes", "get_threads",
           "get_weight_packing_min_rows", "params", "plan", "set_conv_min_rows",
           "set_huge_page_min_bytes", "set_threads", "set_weight_packing_min_rows", "study_ffn",
           "toy", "train", "training_batches", "variant_names", "zoo"]


def _ffn_from_state(state):
    """An FFN from the state FFN.__reduce__ gives (pickle and copy.deepcopy call it): a Python
    function, which pickle names by its module and name at any protocol."""
    return _ffnlab._ffn_from_state(state)


def _run(work, progress, function):
    """work(progress) with the progress the caller asked for (see _progress); a text bar's line
    is ended however the work ends (an error or Ctrl-C ends it before its "end")."""
    bar = _progress(progress, function)
    try:
        return work(bar)
    finally:
        if isinstance(bar, TextProgress):
            try:
                bar.close()
            except (OSError, ValueError):  # a stream that failed: the work's own error stands
                pass


def _progress(progress, function):
    if progress is True:
        return TextProgress()
    if progress is False or progress is None:
        return None
    if not callable(progress):
        text = repr(progress)
        text = text if len(text) <= 60 else text[:57] + "..."
        raise ValueError(f"[python] {function}: progress must be True, False, None or a "
                         f"callable, got {text}")
    return progress


def evolve(out="report", *, quick=False, full=False, seeds=None, max_seeds=None,
           routing_seeds=None, steps=None, variants=None, data=None, sweep=False, margin=None,
           runs=None, resume=False, force=False, sizes=None, tasks=None, budget=None,
           progress=True):
    """Runs the FFN-evolution study (the same as `ffnlab evolve`) and writes its report folder
    `out`: REPORT.md, APPENDIX.md, results.json, the figures and their CSV. Returns the results
    as a dict (the schema of results.json, docs/evolve.md).

    quick: small models and few steps (checks the pipeline). full: the whole study (every
    variant, MoE with top-2 at equal compute, the router z-loss ablation, the routing families
    on the masked objective too), as `ffnlab evolve --full`. seeds: the paired seeds every
    comparison with ReLU trains before its first look (None: 3; quick 2); max_seeds: the cap of
    the sequential rule, up to which an undecided comparison trains one more seed per round
    (None: 6; quick 3; at least `seeds`). steps: per LM run (None: 600; quick 40).
    routing_seeds: the seeds of each routing family (None: 1, which gives no interval; with
    full, `seeds`; at most `seeds`). variants: a non-empty list that includes "relu", or "all"
    (None: relu, gelu, glu, swiglu, gated, moe; with full, every variant). data: a text file or
    a folder (None: the default corpus). sweep: also the d_ff / d_model sweep. margin: the
    equivalence margin in bits/byte, in (0, 1] (None: 0.02). runs: the folder that keeps every
    finished LM run (None: `out` + ".runs"); resume: take the runs it kept instead of training
    them again (a study that stopped trains only what it lacks); force: discard them and start
    over (a folder that keeps runs is refused without resume or force). sizes: sizes of the
    ladder to train every variant at, e.g. ["xs", "s"] (xs, s, m, l: d_model 64, 128, 256, 512;
    "s" is the study's LM); tasks: ["causal", "masked"] adds the masked objective for the dense
    variants; either one adds the section "Across model sizes and tasks" with verdicts per size
    and task and the scaling figure (None for both: one size, one task). budget: a wall-time
    budget, as seconds or a string such as "30m" or "2h": the planner times this machine and
    chooses the sizes (unless given), seeds and steps that fit. progress: True for a text bar,
    False for none, or a callable progress(kind, done, planned, text, eta_seconds). An argument
    of another type or out of range is a ValueError naming it, before any work. Ctrl-C stops it
    (KeyboardInterrupt), also while it draws the figures; the report is not written then (an
    earlier one in `out` is kept), and the finished runs stay in `runs` for resume=True.
    """
    # Every argument but progress, as given: the binding checks each one (a ValueError naming it
    # and its value), so none added to the signature can be left out here.
    options = {name: value for name, value in locals().items() if name != "progress"}
    return _run(lambda bar: _ffnlab._evolve(options, bar), progress, "evolve")


def plan(*, quick=False, full=False, seeds=None, max_seeds=None, routing_seeds=None, steps=None,
         variants=None, data=None, sweep=False, margin=None, sizes=None, tasks=None, budget=None,
         cores=(8, 64, 512)):
    """What evolve(...) with the same arguments will cost, as `ffnlab evolve --plan` prints it:
    a few training steps of each size's ReLU LM are timed on one thread of this machine (seconds;
    longer for large sizes), and nothing is trained or written. With a budget, what the planner
    chose to fit it.

    Returns a dict: "arguments" (sizes, tasks, seeds, max_seeds, steps: what a budget chooses,
    as evolve takes them; given with the other arguments in place of the budget, with
    resume=True, they train this study and take its kept runs), "sizes" (per size: size, d_model, layers, heads, steps,
    relu_step_seconds, relu_run_seconds, runs_first_look, runs_at_cap), "core_hours"
    (first_look: if every comparison decides at its first look; at_cap: if none decides before
    the cap), "other_seconds" (the stages that train nothing), "wall_seconds" (per core count:
    cores, this_machine, first_look, at_cap; this machine's threads first, then `cores`),
    "chosen" (with a budget: what was chosen and why; else "") and "text" (the plan as the
    command prints it). The arguments are evolve's (see its docstring); cores: the core counts,
    besides this machine's, the wall time is given for.
    """
    options = {name: value for name, value in locals().items() if name != "cores"}
    return _ffnlab._plan(options, cores)


def toy(config=None, *, batch=2, seq=4, dropout=0.1, lr=1e-3, iterations=100, seed=42,
        progress=False, **keys):
    """The FFN-evolution tutorial's toy run, as `ffnlab toy` runs it for one layer: a fresh
    layer of `config` and keys (as ffnlab.FFN takes them; the default, ReLU of d_model 512 and
    d_ff 2048 with biases, is the tutorial's) trained alone with Adam (lr) on one fixed random
    batch of batch x seq vectors against fixed random targets, MSE, dropout on the layer's
    input; seed draws the weights, the data and the dropout. Returns one dict per iteration:
    iteration, loss (the MSE, plus an MoE's auxiliary losses with their coefficients) and
    grad_norm (before the update). It measures how fast a layer memorises a few random vectors,
    not language modelling. progress: False for none (the default: the tutorial's run takes a
    fraction of a second), True for a text bar, or a callable progress(kind, done, planned,
    text, eta_seconds) called after every iteration ("step") and at the end ("end"). The GIL is
    released while it trains; Ctrl-C stops it before the next iteration (KeyboardInterrupt)."""
    return _run(lambda bar: _ffnlab._toy(config, bar, batch=batch, seq=seq, dropout=dropout,
                                         lr=lr, iterations=iterations, seed=seed, **keys),
                progress, "toy")


def train(model, data, *, out=None, resume=None, force=False, val_fraction=None, progress=True,
          **settings):
    """Trains `model` (a TransformerLM) in place on the text at `data`; settings are the
    training keys of docs/config.md (steps, batch, seq, lr, seed, ...). Returns the per-step
    log, the periodic evaluations, the final validation and a summary as dicts.

    out: a run folder written as `ffnlab train --out` writes it (train_log.csv, eval_log.csv,
    checkpoint/, summary.json); one that holds an earlier run is refused unless force=True.
    resume: a run folder to continue from, bit-identically (the
    model must be the checkpoint's: TransformerLM.from_run(folder); other settings or other
    data need force=True); the run continues in that folder unless `out` names another. Without
    `out` or `resume` nothing is written (and a checkpoint_every but 0, or force=True, is
    refused). val_fraction: the last fraction of the bytes that is the validation part, in
    (0, 1), as `--val-fraction` (None: 0.1, or the resumed run's). progress: True for a text bar, False for none, or a callable progress(kind, done,
    planned, text, eta_seconds). The settings left out take
    `ffnlab train`'s defaults (docs/config.md: 600 steps, batch 16, seq 128, seed 1, ...);
    the model's context must hold `seq`. The GIL is
    released while it trains; Ctrl-C stops after the current step with a KeyboardInterrupt that
    says the step (its .log holds the steps and evaluations so far), and, in a run folder, a
    checkpoint there to resume from."""
    return _run(lambda bar: _ffnlab.train(model, data, bar, out, resume, force, val_fraction,
                                          **settings), progress, "train")
