"""Validation bits per byte of the reference configuration over several seeds, for ffnlab
(f32 and optionally bf16 products) and for PyTorch on the same model, so that a difference can be
read against the seed spread. Each run trains 600 steps (by default) and evaluates the whole
validation part once at the end. Needs only the standard library; the PyTorch side runs in the
Debian interpreter that has torch:

    python3 bench/lm_seeds.py --seeds 1 2 3 4 [--dtypes f32 bf16] [--no-torch]

Prints one line per run as it ends and a table of means, sample standard deviations and ranges.
"""
import argparse
import os
import statistics
import sys
import tempfile

import lm_runs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    lm_runs.add_common_args(ap)
    ap.add_argument("--dtypes", nargs="+", default=["f32"], choices=["f32", "bf16"],
                    help="ffnlab product precisions (PyTorch runs f32)")
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--no-torch", action="store_true", help="ffnlab runs only")
    a = ap.parse_args()
    lm_runs.require([(a.ffnlab, "ffnlab binary")] +
                    ([] if a.no_torch else [(a.python, "PyTorch interpreter")]))

    results = {}
    with tempfile.TemporaryDirectory(prefix="lm_seeds_") as tmp:
        for seed in a.seeds:
            for v in a.variants:
                sides = ["ffnlab " + dt for dt in a.dtypes] + ([] if a.no_torch else ["torch f32"])
                for side in sides:
                    if side == "torch f32":
                        bpb, tps, _ = lm_runs.torch(a, v, a.steps, seed, True)
                    else:
                        bpb, tps, _ = lm_runs.ffnlab(a, v, a.steps, seed, side.split()[1],
                                                  os.path.join(tmp, "run"), True)
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
