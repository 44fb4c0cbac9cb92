#!/usr/bin/env python3
"""Writes docs/quick-reference.md from a report's results.json (`ffnlab evolve`), so that the
table's measured columns are the report's numbers and can be regenerated after any run:

    python3 scripts/quick_reference.py report/results.json [--record NAME] > docs/quick-reference.md

--record NAME: the run is the record of that name in docs/verdicts.json (scripts/verdicts.py
adds it), which the page then names, with its machine, build and commit.
"""
import argparse
import json
import pathlib
import sys

FORMULA = {
    "relu": "W₂·max(0, W₁x + b₁) + b₂",
    "gelu": "W₂·GELU(W₁x + b₁) + b₂, GELU(a) = a·Φ(a)",
    "glu": "W₂·(σ(W_g x) ⊙ W_u x)",
    "bilinear": "W₂·(W_g x ⊙ W_u x)",
    "reglu": "W₂·(max(0, W_g x) ⊙ W_u x)",
    "geglu": "W₂·(GELU(W_g x) ⊙ W_u x)",
    "swiglu": "W₂·(SiLU(W_g x) ⊙ W_u x), SiLU(a) = a·σ(a)",
    "gated": "W_o·Σ_b σ(G_b x) ⊙ (V_b x), 4 branches",
    "moe": "Σ_{j≤k} w_j·FFN_{e_j}(x), top-k of softmax(W_r x)",
}
PARAMS = {  # one layer, with biases (b: on every Linear)
    "relu": "2DF + F + D", "gelu": "2DF + F + D", "glu": "3DF + 2F + D",
    "bilinear": "3DF + 2F + D", "reglu": "3DF + 2F + D", "geglu": "3DF + 2F + D",
    "swiglu": "3DF + 2F + D", "gated": "(2n+1)DF + 2nF + D",
    "moe": "E(2DF + F + D) + ED + E",
}
MATMUL = {  # forward matrix FLOPs per token
    "relu": "4DF", "gelu": "4DF", "glu": "6DF", "bilinear": "6DF", "reglu": "6DF",
    "geglu": "6DF", "swiglu": "6DF", "gated": "2(2n+1)DF", "moe": "k·4DF + 2DE",
}
USED_BY = {
    "relu": "the original Transformer, T5 v1.0, Switch, OPT",
    "gelu": "BERT, GPT-2, GPT-3",
    "glu": "Dauphin et al. 2017 (convolutional LM)",
    "bilinear": "Shazeer 2020's comparison",
    "reglu": "Shazeer 2020's comparison",
    "geglu": "T5 v1.1, Gemma",
    "swiglu": "PaLM, LLaMA, Mistral, Mixtral and DeepSeek experts",
    "gated": "the tutorial's \"Gated-FFN\"",
    "moe": "Switch, Mixtral, Qwen MoE, DeepSeek-V3",
}


def seeds_text(cfg):
    """How many paired seeds the comparisons trained, as the config says it."""
    seq = cfg.get("sequential")
    if seq:
        return (f"{seq['first_seeds']} to {seq['max_seeds']} paired seeds by the report's "
                f"sequential rule: each comparison with ReLU trains {seq['first_seeds']} paired "
                "seeds, then one more at a time while its interval is undecided, up to "
                f"{seq['max_seeds']}, each look's interval widened so that the error over all "
                f"the looks stays at {100 * seq.get('alpha', 0.05):g} %; [evolve.md](evolve.md#how-many-seeds-the-sequential-rule)")
    return f"{cfg['seeds']} paired seeds"


def record_text(name):
    """The sentence naming the run's record in docs/verdicts.json, and the README's."""
    path = pathlib.Path(__file__).resolve().parents[1] / "docs" / "verdicts.json"
    records = {x["name"]: x for x in json.load(open(path))["records"]}
    if name not in records:
        sys.exit(f"quick_reference.py: no record '{name}' in {path} (it has: "
                 f"{', '.join(records)})")
    x = records[name]
    m = x["machine"]
    bf16 = " with bf16" if m.get("bf16") else ", no bf16"
    cpu = f"{m['cpu']} family {m['family']} model {m['model']}, {m['isa']}{bf16}"
    return (f" Here that run is the record `{name}` of [verdicts.json](verdicts.json): {cpu}, "
            f"{x['build']} build, commit {x['commit']} ([results-study.md](results-study.md) "
            "says how each record was made). The README's findings table quotes the record it "
            "names, whose differences, intervals and seeds need not be these.")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a report's results.json")
    parser.add_argument("--record", help="the run's record in docs/verdicts.json")
    args = parser.parse_args()
    r = json.load(open(args.results))
    train = r["training"]["variants"]
    speed = r["speed"]["variants"]
    sparsity = r.get("sparsity", {}).get("variants", {})
    cfg = r["training"]["config"]
    model = cfg["model"]
    out = []
    out.append("# Quick reference: the FFN variants\n")
    missing = [v for v in FORMULA if v not in train]
    # A run of the whole study: results.json says so, or (before it did) every variant trained.
    full = r.get("full", not missing)
    command = "ffnlab evolve --full" if full else "ffnlab evolve"
    out.append(
        "One row per variant. Formulas and cost columns are closed form (D = d_model, F = d_ff, "
        "n branches, E experts, top-k; docs/costs.md). The measured columns come from one run of "
        f"`{command}` (its results.json; regenerate this page with "
        f"`python3 scripts/quick_reference.py report/results.json --record NAME > "
        "docs/quick-reference.md` "
        f"after `{command} --out report`)."
        + (record_text(args.record) if args.record else "") + " The columns:\n")
    out.append(
        f"- **speed**: forward+backward matrix GFLOP/s as a share of the bare products of the same "
        f"shapes, at d_model 512, d_ff 2048, {r['speed']['tokens']} tokens, {r['threads']} threads;")
    out.append(
        f"- **validation**: bits/byte of a byte-level LM ({model['layers']} layers, d_model "
        f"{model['d_model']}, {cfg['steps']} steps, {seeds_text(cfg)}) at about equal "
        "parameters, mean ± std, and the paired difference to ReLU with its interval and "
        f"verdict (equivalence margin ±{cfg['equivalence_margin']} bits/byte);")
    out.append(
        "- **zero / dead**: exactly-zero hidden activations after training (mean over layers) and "
        "dead units (zero on every census token: the census tokens are the first "
        f"{r.get('sparsity', {}).get('census_tokens', 65536):,} bytes of the validation part, "
        "run through the trained model), seed 1.\n")
    out.append(
        f"Corpus: {r['data']['source']}, {r['data']['bytes']:,} bytes, fingerprint "
        f"`{r['data']['fingerprint']}`. The run took {r['seconds'] / 60:.1f} minutes on "
        f"{r['threads']} threads"
        + (f" of {r['machine']['cpu']}"
           + (f", family {r['machine']['family']} model {r['machine']['model']}"
              if r['machine'].get('family') else "")
           + f" ({r['machine']['isa']}{' with bf16' if r['machine']['bf16'] else ''})"
           if 'machine' in r else "")
        + ".\n")
    out.append("| variant | formula | params (one layer) | fwd matrix FLOPs/token | d_ff at "
               "equal params | speed, fwd+bwd of bare | validation bits/byte | vs ReLU | zero / "
               "dead after training | used by | advice |")
    out.append("|---|---|---|---|---:|---:|---:|---|---|---|---|")
    for v, t in train.items():
        sp = speed.get(v, {}).get("forward_backward_of_bare")
        noisy = speed.get(v, {}).get("noisy", False)
        layers = sparsity.get(v, [])
        zero = sum(l["zero_fraction_trained"] for l in layers) / len(layers) if layers else None
        dead = sum(l["dead_units_trained"] for l in layers) if layers and v != "moe" else None
        units = sum(l["units"] for l in layers) if layers and v != "moe" else None
        zd = "n/a"
        if zero is not None:
            zd = f"{100 * zero:.1f} %" + (f" / {dead} of {units}" if dead is not None else "")
        ci = t.get("paired_difference_to_relu_ci95")
        diff = ("—" if v == "relu" else
                f"{t['paired_difference_to_relu_mean']:+.3f}"
                + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "") + f": {t['verdict']}")
        if v == "relu":
            advice = "the reference; sparse, and loses units to death"
        elif t["verdict"] == "better than ReLU":
            advice = "use it: measurably better than ReLU at the same parameters"
        elif t["verdict"] == "worse than ReLU":
            advice = "worse than ReLU in this run (a small LM trained briefly)"
        elif t["verdict"] == "equivalent to ReLU within the margin":
            advice = "equivalent to ReLU within the run's margin: choose it for other reasons"
        elif t.get("seeds_to_decide"):
            advice = (f"inconclusive: these seeds cannot tell it from ReLU (about "
                      f"{t['seeds_to_decide']} would decide it)")
        else:
            advice = "inconclusive: these seeds cannot tell it from ReLU"
        if v == "moe":
            advice += (f"; at equal total parameters it does {t['d_ff'] * 2 * 100 // (4 * model['d_model'])} % "
                       "of ReLU's expert FLOPs, needs balancing (the report's MoE section), and its "
                       f"seeds spread by {t['std']:.3f}")
        out.append(
            f"| {v} | {FORMULA[v]} | {PARAMS[v]} | {MATMUL[v]} | {t['d_ff']} | "
            f"{'n/a' if sp is None else ('noisy' if noisy else f'{100 * sp:.0f} %')} | "
            f"{t['mean']:.3f} ± {t['std']:.3f} | {diff} | {zd} | {USED_BY[v]} | {advice} |")
    axes = r.get("moe_axes")
    if axes:
        out.append("")
        out.append("MoE on both axes (the report's \"MoE at equal compute\"): the same LM, recipe "
                   "and seeds; parameters and forward FLOPs per token are the whole LM's.\n")
        out.append("| MoE | what | LM params | fwd FLOPs/token | validation bits/byte | vs ReLU "
                   "[interval] |")
        out.append("|---|---|---:|---:|---:|---|")
        for name, row in axes["rows"].items():
            a = row["against_relu"]
            ci = a.get("paired_difference_ci95")
            vs = ("—" if name == "relu" else
                  f"{a['paired_difference_mean']:+.3f}"
                  + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "") + f": {a['verdict']}")
            out.append(f"| {name} | {row['description']} | {row['params']:,} | "
                       f"{row['forward_flops_per_token'] / 1e6:.2f} M | {a['mean']:.3f} ± "
                       f"{a['std']:.3f} | {vs} |")
    out.append("")
    if missing:
        out.append(f"Not trained in this run: {', '.join(missing)}; `ffnlab evolve --full --resume` "
                   "trains every variant, reusing this run's (docs/results-study.md has a full "
                   "run's numbers).\n")
    out.append("The whole report (figures, MoE balancing, the corrections of the tutorial) is "
               "`report/REPORT.md` after `bash scripts/run.sh`; docs/evolve.md describes it.")
    print("\n".join(out))


if __name__ == "__main__":
    main()
