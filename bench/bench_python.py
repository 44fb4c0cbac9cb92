"""ffnlab.torch.FFN against the native PyTorch block in the same process: forward+backward per
call at 8, 512 and 6400 tokens (alternating rounds, medians), and the wrapper's own per-call
overhead at 8 tokens (the wrapped call against ffnlab's numpy API on the same layer).

    PYTHONPATH=build/release/python OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/bench_python.py \
        [--threads 2] [--rounds 5] [--tokens 8,512,6400] [--json]
"""
import argparse
import json
import statistics

import torch_at_best  # this folder

torch_at_best.reexec_at_best()  # PyTorch at its best: before torch is imported

import numpy as np  # noqa: E402
import torch  # noqa: E402

import ffnlab
import ffnlab.torch as ft

from ffnlab.hf_blocks import LlamaMLP, MixtralSparseMoeBlock
from torch_ffn import median_seconds  # this folder: the per-call median of ffnlab bench's PyTorch side


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget", type=float, default=0.3, help="seconds per case and round")
    ap.add_argument("--tokens", default="8,512,6400")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ffnlab.set_threads(a.threads)
    torch.manual_seed(0)
    blocks = {"swiglu 512/1376": LlamaMLP(512, 1376),
              "moe 8x top-2 512/2048": MixtralSparseMoeBlock(512, 2048, 8, 2)}
    rows = []
    for name, block in blocks.items():
        wrapped = ft.from_module(block)
        for T in [int(t) for t in a.tokens.split(",")]:
            x = torch.randn(T, 512)
            xt, xf = x.clone().requires_grad_(True), x.clone().requires_grad_(True)

            def torch_step():
                block(xt).sum().backward()

            def ffnlab_step():
                wrapped(xf).sum().backward()

            times = {"torch": [], "ffnlab": []}
            for _ in range(a.rounds):
                times["torch"].append(median_seconds(torch_step, a.budget))
                times["ffnlab"].append(median_seconds(ffnlab_step, a.budget))
            row = {"block": name, "tokens": T,
                   "torch_s": statistics.median(times["torch"]),
                   "ffnlab_s": statistics.median(times["ffnlab"])}
            row["ratio"] = row["torch_s"] / row["ffnlab_s"]
            if T <= 8:  # the wrapper's overhead: the same work through the numpy API
                layer, xn = wrapped.layer, x.numpy().copy()
                ones = np.ones_like(xn)

                def numpy_step():  # gradients accumulate, as in the wrapped step
                    layer.forward(xn, train=True)
                    layer.backward(ones)

                raw = statistics.median(median_seconds(numpy_step, a.budget) for _ in range(a.rounds))
                row["numpy_api_s"] = raw
                row["wrapper_overhead_s"] = row["ffnlab_s"] - raw
            rows.append(row)
            if not a.json:
                extra = (f"  (numpy API {row['numpy_api_s'] * 1e3:.3f} ms, wrapper "
                         f"+{row['wrapper_overhead_s'] * 1e6:.0f} us)" if T <= 8 else "")
                print(f"{name:24s} T={T:5d}  torch {row['torch_s'] * 1e3:9.3f} ms  ffnlab.torch "
                      f"{row['ffnlab_s'] * 1e3:9.3f} ms  {row['ratio']:.2f}x{extra}", flush=True)
    if a.json:
        print(json.dumps({"threads": a.threads, "rounds": a.rounds, "torch": torch.__version__,
                          "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
