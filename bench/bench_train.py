"""Training throughput and peak memory of `ffnlab train` against PyTorch on the same model, in
one run.

Both sides train the reference configuration (4 layers, d_model 128, 4 heads, learned
positions, tied head, batch 16 x seq 128 bytes of the fortunes corpus, AdamW with clipping), or
with --size large a 4x wider, 2x deeper model on 2x longer sequences (d_model 512, 8 layers,
8 heads, seq 256), and time every whole step (batch sampling, forward, backward, clipping,
update). ffnlab runs f32 and bf16 products (--dtypes); PyTorch runs f32 and, on a CPU with
native bf16, bf16 under torch.autocast (--torch-dtypes). The runs alternate (ffnlab, PyTorch,
ffnlab, ...) so that a drift of the shared machine touches both sides alike; each run's median
step gives its tokens/s, and the table reports the median over rounds and the ratio to PyTorch
at the same precision (to PyTorch f32 where PyTorch did not run that precision), with each
process's peak resident set (getrusage of the child). Needs only the standard library; the PyTorch side runs in the Debian
interpreter that has torch:

    python3 bench/bench_train.py --ffnlab build/release/ffnlab [--size large] [--rounds 3] [--steps 60]
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
    ap.add_argument("--dtypes", nargs="+", default=["f32", "bf16"], choices=["f32", "bf16"],
                    help="ffnlab product precisions to time")
    ap.add_argument("--torch-dtypes", nargs="+", choices=["f32", "bf16"],
                    help="PyTorch precisions to time (bf16: autocast); default: those of "
                         "--dtypes, bf16 only where the CPU has native bf16")
    ap.add_argument("--steps", type=int, default=60, help="steps per run (the median is kept)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating runs per side")
    a = ap.parse_args()
    if a.torch_dtypes is None:
        a.torch_dtypes = [dt for dt in a.dtypes if dt == "f32" or lm_runs.native_bf16()] or ["f32"]
    lm_runs.require([(a.ffnlab, "ffnlab binary"), (a.python, "PyTorch interpreter")])

    rates, rss = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        for r in range(a.rounds):
            for v in a.variants:
                for dt in a.dtypes:
                    _, x, m = lm_runs.ffnlab(a, v, a.steps, 1, dt, os.path.join(tmp, "run"),
                                             False)
                    rates.setdefault((v, "ffnlab " + dt), []).append(x)
                    rss.setdefault((v, "ffnlab " + dt), []).append(m)
                    print(f"round {r + 1}/{a.rounds} {v} ffnlab {dt}: {x:,.0f} tokens/s, "
                          f"peak RSS {m:,.0f} MiB", file=sys.stderr, flush=True)
                for dt in a.torch_dtypes:
                    _, x, m = lm_runs.torch(a, v, a.steps, 1, False, dt)
                    rates.setdefault((v, "torch " + dt), []).append(x)
                    rss.setdefault((v, "torch " + dt), []).append(m)
                    print(f"round {r + 1}/{a.rounds} {v} torch {dt}: {x:,.0f} tokens/s, "
                          f"peak RSS {m:,.0f} MiB", file=sys.stderr, flush=True)

    m = lm_runs.SIZES[a.size]
    print(f"\n{a.size} model (d_model {m['d_model']}, {m['layers']} layers, {m['heads']} heads, "
          f"batch {m['batch']} x seq {m['seq']}); {a.steps} steps per run, {a.rounds} alternating "
          f"rounds, {a.threads} threads; median tokens/s over rounds (per-round values); peak "
          "resident set of the process, largest over rounds; / PyTorch at the same precision "
          "(bf16: autocast), or PyTorch f32 where it did not run that one\n")
    print("| FFN | side | tokens/s | rounds | / PyTorch | peak RSS MiB | / PyTorch |")
    print("|---|---|---|---|---|---|---|")
    for v in a.variants:
        sides = ["ffnlab " + dt for dt in a.dtypes] + ["torch " + dt for dt in a.torch_dtypes]
        for side in sides:
            dt = side.split()[1]
            ref = next((r for r in ("torch " + dt, "torch f32") if r in sides), None)
            xs = rates[(v, side)]
            med = statistics.median(xs)
            each = ", ".join(f"{x:,.0f}" for x in xs)
            peak = max(rss[(v, side)])
            if ref is None:  # only PyTorch bf16 ran: no reference at f32
                ratio = ratio_rss = "-"
            else:
                ratio = f"{med / statistics.median(rates[(v, ref)]):.2f}x"
                ratio_rss = f"{peak / max(rss[(v, ref)]):.2f}x"
            print(f"| {v}, d_ff {m['d_ff'][v]} | {side} | {med:,.0f} | {each} | {ratio} "
                  f"| {peak:,.0f} | {ratio_rss} |")


if __name__ == "__main__":
    main()
