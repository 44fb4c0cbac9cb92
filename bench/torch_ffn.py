#!/usr/bin/python3
"""The PyTorch side of `ffnlab bench`: the same FFN layers in PyTorch, timed on request.

ffnlab bench starts this script once and alternates with it: it times its own layer, then asks
this process for PyTorch's time of the same layer, then the next round. Protocol: one JSON object
per line on stdin, one JSON answer per line on stdout. The first line written is
{"ready": true, "torch": version, "threads": n, "runtime": what PyTorch runs with} (or
{"ready": false, "error": ...}); it runs PyTorch at its best (torch_at_best.py). A request

  {"variant": "swiglu", "kind": "glu", "act": "silu", "d_model": 512, "d_ff": 2048,
   "bias": true, "branches": 1, "experts": 0, "top_k": 0, "normalize": true,
   "tokens": 8, "pass": "inference" | "forward_backward", "dtype": "f32" | "bf16",
   "weights": "f32" | "bf16", "budget": 0.1}

is answered {"seconds": median seconds per call} or {"skipped": reason}. {"free": true} drops
the layers kept so far. The modules follow Hugging Face's definitions: LlamaMLP for the GLU
family (down(act(gate(x)) * up(x))), the plain FFN down(act(up(x))), the multi-branch gated FFN
as the sum of such gated branches, and MixtralSparseMoeBlock for MoE (softmax router, top-k,
renormalised, experts run on their tokens with index_add_). dtype bf16 runs the products under
torch.autocast (PyTorch's mixed precision); weights bf16 (inference) stores the module in bf16.
"""
import json
import sys
import time


def activation(torch, name):
    F = torch.nn.functional
    return {
        "relu": F.relu,
        "gelu": F.gelu,
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "gelu_quick": lambda x: x * torch.sigmoid(1.702 * x),
        "silu": F.silu,
        "sigmoid": torch.sigmoid,
        "tanh": torch.tanh,
        "relu2": lambda x: F.relu(x) ** 2,
        "identity": lambda x: x,
    }[name]


def build(torch, r):
    nn = torch.nn
    D, Fh, bias = r["d_model"], r["d_ff"], r["bias"]
    act = activation(torch, r["act"])

    class Dense(nn.Module):
        def __init__(self, kind, branches):
            super().__init__()
            self.kind = kind
            if kind == "plain":
                self.up = nn.Linear(D, Fh, bias=bias)
            elif kind in ("glu", "multi_branch"):
                n = 1 if kind == "glu" else branches
                self.gates = nn.ModuleList(nn.Linear(D, Fh, bias=bias) for _ in range(n))
                self.ups = nn.ModuleList(nn.Linear(D, Fh, bias=bias) for _ in range(n))
            else:  # a new kind is written here from its definition, not taken for another
                raise ValueError(f"torch_ffn: no PyTorch layer for FFN kind '{kind}'")
            self.down = nn.Linear(Fh, D, bias=bias)

        def forward(self, x):
            if self.kind == "plain":
                return self.down(act(self.up(x)))
            h = None
            for g, u in zip(self.gates, self.ups):
                part = act(g(x)) * u(x)
                h = part if h is None else h + part
            return self.down(h)

    class MoE(nn.Module):  # Hugging Face's MixtralSparseMoeBlock, with ffnlab's expert kinds
        def __init__(self):
            super().__init__()
            self.k, self.normalize = r["top_k"], r["normalize"]
            self.gate = nn.Linear(D, r["experts"], bias=r.get("router_bias", False))
            self.experts = nn.ModuleList(Dense(r["kind"], r["branches"])
                                         for _ in range(r["experts"]))

        def forward(self, x):
            logits = self.gate(x)
            weights = torch.softmax(logits, dim=1, dtype=torch.float)
            weights, chosen = torch.topk(weights, self.k, dim=-1)
            if self.normalize:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            weights = weights.to(x.dtype)
            out = torch.zeros_like(x)
            mask = torch.nn.functional.one_hot(chosen, num_classes=len(self.experts)).permute(2, 1, 0)
            for e, expert in enumerate(self.experts):
                idx, top = torch.where(mask[e])
                if top.numel() == 0:
                    continue
                y = expert(x[top]) * weights[top, idx, None]
                out.index_add_(0, top, y.to(x.dtype))
            return out

    return MoE() if r["experts"] > 0 else Dense(r["kind"], r["branches"])


def median_seconds(f, budget):
    f()
    times = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < budget and len(times) < 1000):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def available_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return float("inf")


def main():
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    import torch_at_best  # beside this script (installed with it)
    torch_at_best.reexec_at_best()  # without forced OpenBLAS kernels, with a caching allocator
    try:
        import torch
    except Exception as e:  # no PyTorch: ffnlab bench goes on without it
        print(json.dumps({"ready": False, "error": f"{type(e).__name__}: {e}"}), flush=True)
        return
    if threads > 0:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    print(json.dumps({"ready": True, "torch": torch.__version__,
                      "threads": torch.get_num_threads(),
                      "runtime": torch_at_best.runtime(torch)}), flush=True)
    layers = {}
    for line in sys.stdin:
        r = json.loads(line)
        if r.get("free"):
            layers.clear()
            torch_at_best.release_memory()
            print(json.dumps({"freed": True}), flush=True)
            continue
        key = json.dumps({k: v for k, v in r.items()
                          if k not in ("tokens", "pass", "budget", "dtype")}, sort_keys=True)
        if key not in layers:
            layers.clear()
            torch_at_best.release_memory()  # the last layer's memory, before measuring what is left
            params = r.get("params", 0)
            # bf16 weights are built in f32 and then converted: both copies at once.
            need = params * (4 + 2 if r.get("weights") == "bf16" else 4) * 1.25
            if need > 0.8 * available_bytes():
                print(json.dumps({"skipped": f"needs {need / 2**30:.1f} GiB, more than 80% of "
                                             f"the {available_bytes() / 2**30:.1f} GiB available"}),
                      flush=True)
                continue
            m = build(torch, r)
            if r.get("weights") == "bf16":
                m = m.to(torch.bfloat16)
            layers[key] = m
        m = layers[key]
        T, D = r["tokens"], r["d_model"]
        in_dtype = torch.bfloat16 if r.get("weights") == "bf16" else torch.float32
        x = torch.randn(T, D).to(in_dtype)
        dy = torch.randn(T, D).to(in_dtype)
        autocast = r["dtype"] == "bf16" and r.get("weights") != "bf16"

        def run():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                if r["pass"] == "inference":
                    with torch.no_grad():
                        m(x)
                else:
                    xg = x.detach().requires_grad_(True)
                    out = m(xg)
                    out.backward(dy.to(out.dtype))

        print(json.dumps({"seconds": median_seconds(run, r["budget"])}), flush=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C reaches the whole group: ffnlab bench says it, not we
        sys.exit(130)
