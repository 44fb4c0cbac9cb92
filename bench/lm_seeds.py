"""Validation bits per byte of issue 4's reference configuration over several seeds, for ffnlab
(f32 and optionally bf16 products) and for PyTorch on the same model, so that a difference can be
read against the seed spread. Each run trains 600 steps (by default) and evaluates the whole
validation part once at the end. Needs only the standard library; the PyTorch side runs in the
Debian interpreter that has torch:

    python3 bench/lm_seeds.py --seeds 1 2 3 4 [--dtypes f32 bf16] [--no-torch]

Prints one line per run as it ends and a table of means, sample standard deviations and ranges.
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


def ffnlab_run(a, variant, dtype, seed, out):
    cmd = [a.ffnlab, "train", "--variant", variant, "--d-ff", str(D_FF[variant]),
           "--steps", str(a.steps), "--seed", str(seed), "--threads", str(a.threads),
           "--dtype", dtype, "--eval-every", "0", "--sample", "0", "--data", a.data, "--out", out]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    return s["evaluations"][-1]["bits_per_byte"], s["median_tokens_per_second"]


def torch_run(a, variant, seed):
    cmd = [a.python, os.path.join(HERE, "torch_train.py"), "--variant", variant,
           "--d-ff", str(D_FF[variant]), "--steps", str(a.steps), "--seed", str(seed),
           "--threads", str(a.threads), "--data", a.data]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    m = re.search(r"median (\d+) tokens/s, validation ([\d.]+) bits/byte", out)
    if not m:
        sys.exit(f"lm_seeds: no result in PyTorch's output:\n{out}")
    return float(m.group(2)), float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ffnlab", default=os.path.join(HERE, "..", "build", "release", "ffnlab"))
    ap.add_argument("--python", default="/usr/bin/python3", help="interpreter with torch")
    ap.add_argument("--variants", nargs="+", default=["relu", "swiglu"], choices=sorted(D_FF))
    ap.add_argument("--dtypes", nargs="+", default=["f32"], choices=["f32", "bf16"],
                    help="ffnlab product precisions (PyTorch runs f32)")
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", default="/usr/share/games/fortunes")
    ap.add_argument("--no-torch", action="store_true", help="ffnlab runs only")
    a = ap.parse_args()
    need = [(a.ffnlab, "ffnlab binary")] + ([] if a.no_torch else [(a.python, "interpreter")])
    for path, what in need:
        if not os.access(path, os.X_OK):
            sys.exit(f"lm_seeds: {what} {path} not found (build first; "
                     "scripts/install-deps.sh installs PyTorch)")

    results = {}
    with tempfile.TemporaryDirectory(prefix="lm_seeds_") as tmp:
        for seed in a.seeds:
            for v in a.variants:
                runs = [("ffnlab " + dt, lambda dt=dt: ffnlab_run(a, v, dt, seed,
                                                                  os.path.join(tmp, "run")))
                        for dt in a.dtypes]
                if not a.no_torch:
                    runs.append(("torch f32", lambda: torch_run(a, v, seed)))
                for side, fn in runs:
                    bpb, tps = fn()
                    results.setdefault((v, side), []).append(bpb)
                    print(f"seed {seed} {v} {side}: {bpb:.4f} bits/byte, {tps:,.0f} tokens/s",
                          file=sys.stderr, flush=True)

    print(f"\nvalidation bits/byte after {a.steps} steps, seeds {' '.join(map(str, a.seeds))}\n")
    print("| FFN | side | mean | std | min | max | runs |")
    print("|---|---|---|---|---|---|---|")
    for (v, side), xs in results.items():
        sd = statistics.stdev(xs) if len(xs) > 1 else float("nan")
        each = ", ".join(f"{x:.4f}" for x in xs)
        print(f"| {v} | {side} | {statistics.mean(xs):.4f} | {sd:.4f} | {min(xs):.4f} | "
              f"{max(xs):.4f} | {each} |")


if __name__ == "__main__":
    main()
