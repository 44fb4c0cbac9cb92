"""Training throughput of `ffnlab train` against PyTorch on the same model, in one run.

Both sides train issue 4's reference configuration (4 layers, d_model 128, 4 heads, learned
positions, tied head, batch 16 x seq 128 bytes of the fortunes corpus, AdamW with clipping) and
time every whole step (batch sampling, forward, backward, clipping, update). The runs alternate
(ffnlab, PyTorch, ffnlab, ...) so that a drift of the shared machine touches both sides alike;
each run's median step gives its tokens/s, and the table reports the median over rounds and the
ratio ffnlab / PyTorch. Needs only the standard library; the PyTorch side runs in the Debian
interpreter that has torch:

    python3 bench/bench_train.py --ffnlab build/release/ffnlab [--rounds 3] [--steps 60]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
D_FF = {"relu": 512, "swiglu": 344}  # the widths: equal parameter counts


def ffnlab_rate(a, variant, dtype, out):
    cmd = [a.ffnlab, "train", "--variant", variant, "--d-ff", str(D_FF[variant]),
           "--steps", str(a.steps), "--seed", "1", "--threads", str(a.threads), "--dtype", dtype,
           "--eval-every", "0", "--eval-tokens", "2048", "--sample", "0", "--data", a.data,
           "--out", out]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)["median_tokens_per_second"]


def torch_rate(a, variant):
    cmd = [a.python, os.path.join(HERE, "torch_train.py"), "--variant", variant,
           "--d-ff", str(D_FF[variant]), "--steps", str(a.steps), "--threads", str(a.threads),
           "--data", a.data, "--skip-eval"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    m = re.search(r"median (\d+) tokens/s", out)
    if not m:
        sys.exit(f"bench_train: no rate in PyTorch's output:\n{out}")
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ffnlab", default=os.path.join(HERE, "..", "build", "release", "ffnlab"))
    ap.add_argument("--python", default="/usr/bin/python3", help="interpreter with torch")
    ap.add_argument("--variants", nargs="+", default=["relu", "swiglu"], choices=sorted(D_FF))
    ap.add_argument("--dtypes", nargs="+", default=["f32", "bf16"], choices=["f32", "bf16"],
                    help="ffnlab product precisions to time (PyTorch runs f32)")
    ap.add_argument("--steps", type=int, default=60, help="steps per run (the median is kept)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating runs per side")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", default="/usr/share/games/fortunes")
    a = ap.parse_args()
    for path, what in ((a.ffnlab, "ffnlab binary"), (a.python, "PyTorch interpreter")):
        if not os.access(path, os.X_OK):
            sys.exit(f"bench_train: {what} {path} not found (build first; "
                     "scripts/install-deps.sh installs PyTorch)")

    rates = {}
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        for r in range(a.rounds):
            for v in a.variants:
                for dt in a.dtypes:
                    x = ffnlab_rate(a, v, dt, os.path.join(tmp, f"{v}_{dt}"))
                    rates.setdefault((v, "ffnlab " + dt), []).append(x)
                    print(f"round {r + 1}/{a.rounds} {v} ffnlab {dt}: {x:,.0f} tokens/s",
                          file=sys.stderr, flush=True)
                x = torch_rate(a, v)
                rates.setdefault((v, "torch f32"), []).append(x)
                print(f"round {r + 1}/{a.rounds} {v} torch f32: {x:,.0f} tokens/s",
                      file=sys.stderr, flush=True)

    print(f"\n{a.steps} steps per run, {a.rounds} alternating rounds, {a.threads} threads; "
          "median tokens/s over rounds (per-round values)\n")
    print("| FFN | side | tokens/s | rounds | / PyTorch |")
    print("|---|---|---|---|---|")
    for v in a.variants:
        base = statistics.median(rates[(v, "torch f32")])
        for side in ["ffnlab " + dt for dt in a.dtypes] + ["torch f32"]:
            xs = rates[(v, side)]
            med = statistics.median(xs)
            each = ", ".join(f"{x:,.0f}" for x in xs)
            print(f"| {v} | {side} | {med:,.0f} | {each} | {med / base:.2f}x |")


if __name__ == "__main__":
    main()
