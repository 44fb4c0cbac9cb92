#!/usr/bin/python3
"""A record of what the MoE layer computes, to compare before and after a change that must keep
behaviour bit for bit (a refactor of the layer, the router or the expert kernels).

    scripts/moe_record.py record OUT.json [--build build/release] [--steps 20]
    scripts/moe_record.py compare BEFORE.json AFTER.json
    scripts/moe_record.py selftest [--build build/release]

`record` writes, for the same machine and build options:
  - layers: for each MoE configuration below (every routing family and add-on), the parameter
    names in buffer order with their shapes, the sha256 of their initial values, and the sha256
    of y, dx, every parameter gradient, the auxiliary loss and the statistics of one training
    forward and backward on a fixed input, then of one inference forward; for some of them the
    same in bf16 products, and an inference forward from bf16 weights;
  - train: the sha256 of the weights file of a short `ffnlab train` run per routing family
    (MoE++ with gating residuals and both masked-objective families included), and of its
    training and evaluation logs without their timing columns;
  - params: `ffnlab params --json --variants all` (and one per routing family).
`compare` prints every entry that differs and exits 1 if any does. `selftest` records twice and
compares (what the test suite runs: every family recorded, and the record reproducible).
Not covered: expert and data parallelism (compare mpirun runs' checkpoints for those).

The numbers depend on the CPU's instruction set (the kernels differ): compare records taken on
one machine. Run it with the Debian interpreter (numpy) and PYTHONPATH=<build>/python.
"""
import argparse
import csv
import hashlib
import io
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

# Every routing family and add-on of the MoE layer, small enough to run in seconds.
BASE = {"variant": "moe", "d_model": 16, "d_ff": 24, "moe": {"num_experts": 4, "top_k": 2}}
LAYERS = {
    "topk": {},
    "topk_glu_shared": {"moe": {"expert_kind": "glu", "num_shared": 1, "shared_gate": True,
                                "router_bias": False}},
    "topk_sigmoid_groups": {"moe": {"num_experts": 8, "score": "sigmoid", "groups": 4,
                                    "topk_groups": 2, "scaling": 2.5, "balance_bias": True}},
    "topk_after_softmax": {"moe": {"softmax_after_topk": True, "normalize": False}},
    "topk_capacity_position": {"moe": {"capacity_factor": 1.0, "z_coef": 0.001, "aux_coef": 0.01}},
    "topk_capacity_probability": {"moe": {"capacity_factor": 0.75, "drop": "probability",
                                          "balance_loss": "top1", "aux_coef": 0.01}},
    "topk_noisy_jitter": {"moe": {"noisy_topk": True, "jitter": 0.1}},
    "topk_fine_grained": {"moe": {"num_experts": 8, "expert_d_ff": 8, "top_k": 3,
                                  "balance_loss": "topk_normalized", "aux_coef": 0.02}},
    "top_p": {"moe": {"routing": "top_p", "top_p": 0.5, "entropy_coef": 0.001}},
    "top_p_normalize_off": {"moe": {"routing": "top_p", "top_p": 0.6, "normalize": False}},
    "relu": {"moe": {"routing": "relu", "normalize": False, "aux_coef": 0.0}},
    "relu_target": {"moe": {"routing": "relu", "normalize": False, "target_sparsity": 0.6,
                            "l1_coef_init": 1e-4}},
    "moe_pp": {"moe": {"num_experts": 4, "constant_experts": 1, "copy_experts": 1,
                       "zero_experts": 1, "zc_balance_weight": 0.5, "aux_coef": 0.01}},
    "moe_pp_first_residual": {"moe": {"constant_experts": 1, "copy_experts": 1,
                                      "zero_experts": 1, "gating_residual": True}},
    "expert_choice": {"moe": {"routing": "expert_choice", "normalize": False, "aux_coef": 0.0,
                              "capacity_factor": 1.0}},
    "soft": {"moe": {"routing": "soft", "slots": 2, "aux_coef": 0.0}},
    "hash": {"moe": {"routing": "hash"}},
    "base": {"moe": {"routing": "base", "top_k": 1}},
}
# Also recorded with bf16 products and bf16 inference weights.
BF16 = ("topk_glu_shared", "top_p", "moe_pp", "soft")
SEQUENCE = 6  # tokens per sequence (expert choice and Soft MoE route whole sequences)
TOKENS = 24

# Short training runs: every routing family, MoE++ with gating residuals, both masked families.
TRAIN = {
    "topk": "--variant moe",
    "topk_capacity": "--variant moe --capacity 1.0 --z-coef 0.001 --shared-experts 1",
    "top_p": "--variant moe --routing top_p --top-p 0.6",
    "relu": "--variant moe --routing relu",
    "moe_pp": "--variant moe --constant-experts 1 --copy-experts 1 --zero-experts 1 "
              "--gating-residual --layers 2",
    "expert_choice": "--variant moe --routing expert_choice --objective masked",
    "soft": "--variant moe --routing soft --objective masked",
    "hash": "--variant moe --routing hash",
    "base": "--variant moe --routing base --top-k 1",
}


def sha(data):
    return hashlib.sha256(data).hexdigest()[:16]


def array_hash(a):
    import numpy as np
    return sha(np.ascontiguousarray(a).tobytes())


def merged(base, extra):
    out = json.loads(json.dumps(base))
    for k, v in extra.items():
        if isinstance(v, dict):
            out.setdefault(k, {}).update(v)
        else:
            out[k] = v
    return out


def record_layers():
    import numpy as np
    import ffnlab
    out = {}
    rng = np.random.default_rng(7)
    x = rng.standard_normal((TOKENS, BASE["d_model"]), dtype=np.float32)
    dy = rng.standard_normal((TOKENS, BASE["d_model"]), dtype=np.float32)
    ids = rng.integers(0, 256, TOKENS, dtype=np.int64)  # what hash routing reads
    for name, extra in LAYERS.items():
        config = merged(BASE, extra)
        layer = ffnlab.FFN(config, seed=3)
        params = layer.parameters()
        entry = {"parameters": [[n, list(v.shape), array_hash(v)] for n, v in params.items()]}
        residual = None
        if config["moe"].get("gating_residual"):  # a second layer fed the first one's logits
            first = ffnlab.FFN(config, seed=5)
            first.forward(x, train=True, sequence=SEQUENCE, first=True)
            residual = first.logits
        tokens = ids if config["moe"].get("routing") == "hash" else None
        layer.zero_grad()
        y = layer.forward(x, train=True, sequence=SEQUENCE, gate_residual=residual,
                          token_ids=tokens)
        dx = layer.backward(dy)
        entry["y"] = array_hash(y)
        entry["dx"] = array_hash(dx)
        entry["grads"] = {n: array_hash(g) for n, g in layer.grads().items()}
        entry["aux_loss"] = repr(layer.aux_loss)
        entry["stats"] = sha(json.dumps(layer.stats(), sort_keys=True, default=str).encode())
        entry["inference_y"] = array_hash(layer.forward(
            x, train=False, sequence=SEQUENCE, gate_residual=residual, token_ids=tokens))
        if name in BF16:
            layer.precision = "bf16"
            layer.zero_grad()
            entry["bf16_y"] = array_hash(
                layer.forward(x, train=True, sequence=SEQUENCE, gate_residual=residual))
            entry["bf16_dx"] = array_hash(layer.backward(dy))
            entry["bf16_grads"] = {n: array_hash(g) for n, g in layer.grads().items()}
            layer.inference_weights = "bf16"
            entry["bf16_weights_y"] = array_hash(
                layer.forward(x, train=False, sequence=SEQUENCE, gate_residual=residual))
        out[name] = entry
    return out


def masked_csv(path):
    """A log's rows without the columns that hold times."""
    rows = list(csv.reader(io.StringIO(path.read_text())))
    if not rows:
        return ""
    keep = [i for i, c in enumerate(rows[0]) if c not in ("seconds", "tokens_per_s")]
    return "\n".join(",".join(r[i] for i in keep if i < len(r)) for r in rows)


def record_training(program, corpus, steps):
    out = {}
    common = (f"--data {corpus} --batch 4 --seq 32 --d-model 32 --layers 1 --heads 2 "
              f"--eval-every 10 --eval-tokens 512 --threads 1 --sample 0 --steps {steps}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in TRAIN.items():
            folder = pathlib.Path(tmp) / name
            args = [program, "train", *common.split(), *flags.split(), "--out", str(folder)]
            if "--layers" in flags:  # the family's own layer count replaces the common one
                i = args.index("--layers")
                del args[i:i + 2]
            r = subprocess.run(args, capture_output=True, text=True)
            if r.returncode != 0:
                out[name] = {"error": r.stderr.strip()[-300:]}
                continue
            weights = sorted((folder / "checkpoint").glob("weights-*.safetensors"))
            out[name] = {
                "weights": [sha(w.read_bytes()) for w in weights],
                "train_log": sha(masked_csv(folder / "train_log.csv").encode()),
                "eval_log": sha(masked_csv(folder / "eval_log.csv").encode()),
            }
    return out


def program_families(program):
    """The routing families the program knows, as its --routing help lists them."""
    shown = subprocess.run([program, "params", "--help"], capture_output=True, text=True)
    listed = re.search(r"how a token gets its experts: ([a-z_, ]+) \(", shown.stdout)
    return listed.group(1).split(", ") if listed else ["(no --routing list in the help)"]


def record_params(program):
    # Every variant (top-k's MoE among them), each other routing family, and MoE++.
    cases = {"all": "--variants all",
             "moe_pp": "--variants moe --constant-experts 1 --copy-experts 1 --zero-experts 1 "
                       "--gating-residual"}
    cases.update({f: f"--routing {f}" for f in program_families(program) if f != "topk"})
    out = {}
    for name, flags in cases.items():
        r = subprocess.run([program, "params", "--json", *flags.split()], capture_output=True,
                           text=True)
        out[name] = r.stdout if r.returncode == 0 else "error: " + r.stderr.strip()
    return out


def compare(before, after, where=""):
    differs = []
    if isinstance(before, dict) and isinstance(after, dict):
        for k in sorted(set(before) | set(after)):
            if k not in before or k not in after:
                differs.append(f"{where}{k}: only in {'after' if k in after else 'before'}")
            else:
                differs += compare(before[k], after[k], f"{where}{k}.")
    elif before != after:
        differs.append(f"{where.rstrip('.')}: {str(before)[:200]} -> {str(after)[:200]}")
    return differs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="write a record of this build's MoE layer")
    rec.add_argument("out")
    rec.add_argument("--build", default="build/release")
    rec.add_argument("--steps", type=int, default=20)
    rec.add_argument("--data", default="", help="a text corpus (default: a generated one)")
    rec.add_argument("--check", action="store_true",
                     help="exit 1 unless every layer and run was recorded and every "
                          "routing family the program lists is among them")
    cmp = sub.add_parser("compare", help="list where two records differ")
    cmp.add_argument("before")
    cmp.add_argument("after")
    st = sub.add_parser("selftest", help="record twice and compare (the test suite's check)")
    st.add_argument("--build", default="build/release")
    a = ap.parse_args()
    if a.command == "selftest":
        with tempfile.TemporaryDirectory() as tmp:
            for name in ("a", "b"):
                r = subprocess.run([sys.executable, __file__, "record", f"{tmp}/{name}.json",
                                    "--build", a.build, "--check"])
                if r.returncode != 0:
                    return r.returncode
            return subprocess.run([sys.executable, __file__, "compare", f"{tmp}/a.json",
                                   f"{tmp}/b.json"]).returncode
    if a.command == "compare":
        differs = compare(json.loads(pathlib.Path(a.before).read_text()),
                          json.loads(pathlib.Path(a.after).read_text()))
        print("\n".join(differs) if differs else "identical")
        return 1 if differs else 0
    build = pathlib.Path(a.build)
    program = str(build / "ffnlab")
    sys.path.insert(0, str(build / "python"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = a.data
        if not corpus:  # a fixed corpus: the same bytes on every run
            corpus = str(pathlib.Path(tmp) / "corpus.txt")
            words = ["expert", "router", "token", "layer", "gate", "sparse", "dense", "mixture"]
            text = " ".join(words[(i * 7 + i // 5) % len(words)] for i in range(20000))
            pathlib.Path(corpus).write_text(text)
        record = {"layers": record_layers(), "train": record_training(program, corpus, a.steps),
                  "params": record_params(program)}
    pathlib.Path(a.out).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    errors = [n for n, e in record["train"].items() if "error" in e]
    print(f"recorded {len(record['layers'])} layers, {len(record['train'])} runs"
          + (f"; runs that failed: {', '.join(errors)}" if errors else "") + f" -> {a.out}")
    if a.check:
        missing = [n for n in LAYERS if n not in record["layers"]]
        # Every routing family the program knows (its --routing help lists them) is recorded
        # (params records each by the same list).
        families = program_families(program)
        layers = {merged(BASE, e)["moe"].get("routing", "topk") for e in LAYERS.values()}
        runs = {f.split("--routing ")[1].split()[0] if "--routing " in f else "topk"
                for f in TRAIN.values()}
        missing += [f"routing family {f}" for f in families if f not in layers or f not in runs]
        failed = errors + [n for n, p in record["params"].items() if p.startswith("error")]
        if missing or failed:
            print("not recorded:", ", ".join(missing + failed), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
