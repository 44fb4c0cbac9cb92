"""PyTorch side of the language-model comparison: the reference configuration (pre-norm
byte-level LM on the fortunes corpus) trained with the same model, schedule, data split and
evaluation as `ffnlab train`, printing tokens/s and validation bits per byte. Run with the Debian
PyTorch:  /usr/bin/python3 bench/torch_train.py --variant relu --d-ff 512 --threads 2

--from-ffnlab takes the initial weights and every batch from ffnlab itself (its Python module:
PYTHONPATH=build/release/python), so that PyTorch trains exactly the model ffnlab trains at that
seed, and trains it in ffnlab beside it: the two runs differ only in their arithmetic. The model's
FFN is the study's layer (ffnlab.study_ffn); its MoE (--variant moe: 8 ReLU experts of width 64
with biases, top-2, router with bias, balancing loss 0.01) is the Mixtral-style block of
tests/parity/torch_lm.py, trained here without the study's router z-loss, which that block does
not have.
  PYTHONPATH=build/release/python /usr/bin/python3 bench/torch_train.py --from-ffnlab \
      --variant moe --seed 2 --warmup 50"""
import argparse
import contextlib
import math
import os
import sys
import time

import torch_at_best  # noqa: E402  (this folder)

torch_at_best.reexec_at_best()  # PyTorch at its best: before torch is imported

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "parity"))
import torch_lm  # noqa: E402


def load(path):
    files = []
    for root, _, names in os.walk(path):
        files += [os.path.join(root, n) for n in names if not n.endswith((".dat", ".u8"))]
    data = b"".join(open(f, "rb").read() for f in sorted(files))
    return torch.tensor(list(data), dtype=torch.long)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", default="relu", choices=["relu", "swiglu", "moe"])
    ap.add_argument("--d-ff", type=int, default=512)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", default="/usr/share/games/fortunes")
    ap.add_argument("--init-std", type=float, default=0.02,
                    help="every matrix N(0, s) and biases zero (GPT-2, ffnlab's default); "
                         "0: torch.nn defaults")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--from-ffnlab", action="store_true",
                    help="initial weights and batches from ffnlab's Python module; ffnlab trains "
                         "the same run too")
    ap.add_argument("--skip-eval", action="store_true", help="time training only")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"],
                    help="bf16: the forward under torch.autocast (bf16 products, f32 weights "
                         "and optimizer), PyTorch's mixed precision on the CPU")
    a = ap.parse_args()
    if a.from_ffnlab and a.dtype != "f32":
        sys.exit("--from-ffnlab compares f32 arithmetic; --dtype bf16 is for timing runs")
    if a.from_ffnlab:
        return from_ffnlab(a)
    if a.variant == "moe":
        sys.exit("--variant moe needs --from-ffnlab (the study's MoE config comes from ffnlab)")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    data = load(a.data)
    split = int(math.floor(len(data) * 0.9))
    train, val = data[:split], data[split:]
    S, B = a.seq, a.batch
    kind, act = ("glu", "silu") if a.variant == "swiglu" else ("plain", "relu")
    cfg = dict(vocab=256, d_model=a.d_model, layers=a.layers, heads=a.heads, context=S,
               attn_bias=True, norm_eps=1e-5,
               tied_head=True, ffn=dict(kind=kind, act=act, d_ff=a.d_ff, bias=True))
    cfg["init_std"] = a.init_std
    model = torch_lm.LM(cfg)
    opt = torch_lm.optimizer(model, 3e-3, (0.9, 0.95), 0.1)
    times = []
    for step in range(a.steps):
        t0 = time.perf_counter()
        starts = torch.randint(0, len(train) - S, (B,))
        win = torch.stack([train[s:s + S + 1] for s in starts.tolist()])
        ids, tgt = win[:, :-1].reshape(-1), win[:, 1:].reshape(-1)
        for g in opt.param_groups:
            g["lr"] = torch_lm.lr_at(step, 3e-3, a.warmup, a.steps, 0.1)
        with precision(a.dtype):
            ce, aux = model(ids, tgt, S)
        opt.zero_grad(set_to_none=True)
        (ce + aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    times.sort()
    tps = B * S / times[len(times) // 2]
    if a.skip_eval:
        print(f"torch {a.dtype} {a.variant} d_ff {a.d_ff} seed {a.seed} init_std {a.init_std}: "
              f"median {tps:.0f} tokens/s over {a.steps} steps")
        return
    print(f"torch {a.dtype} {a.variant} d_ff {a.d_ff} seed {a.seed} init_std {a.init_std}: median "
          f"{tps:.0f} tokens/s, validation {validation_bits(model, val, S, B, a.dtype):.4f} "
          f"bits/byte after {a.steps} steps")


def precision(dtype):
    """The forward's context: autocast to bf16, or nothing for f32."""
    if dtype == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def validation_bits(model, val, S, B, dtype="f32"):
    """ffnlab's evaluation: consecutive windows over the whole validation part."""
    model.eval()
    total, n = 0.0, 0
    with torch.no_grad():
        W = (len(val) - 1) // S
        for w0 in range(0, W, B):
            ws = range(w0, min(W, w0 + B))
            ids = torch.cat([val[w * S:w * S + S] for w in ws])
            tgt = torch.cat([val[w * S + 1:w * S + S + 1] for w in ws])
            with precision(dtype):
                ce, _ = model(ids, tgt, S)
            total += ce.item() * ids.numel()
            n += ids.numel()
    model.train()
    return total / n / math.log(2)


def from_ffnlab(a):
    import ffnlab  # noqa: E402  (build/<preset>/python on PYTHONPATH)
    torch.set_num_threads(a.threads)
    ffnlab.set_threads(a.threads)
    shape = dict(d_model=a.d_model, layers=a.layers, heads=a.heads, context=a.seq)
    layer = ffnlab.study_ffn(a.variant, a.d_model)
    if a.variant == "moe":
        layer["moe"]["z_coef"] = 0.0  # torch_lm's block has no router z-loss
    lm = ffnlab.TransformerLM(ffn=layer, seed=a.seed, **shape)
    c = lm.config
    f = c["ffn"]
    if a.variant == "moe":
        m = f["moe"]
        ffn = dict(kind="moe", act=f["activation"], d_ff=m.get("expert_d_ff") or f["d_ff"],
                   experts=m["num_experts"], top_k=m["top_k"], aux_coef=m["aux_coef"],
                   glu=m.get("expert_kind", "plain") == "glu", bias=f["bias"],
                   router_bias=m.get("router_bias", True))
    else:
        ffn = dict(kind=f["kind"], act=f["activation"], d_ff=f["d_ff"], bias=f["bias"])
    cfg = dict(vocab=256, d_model=a.d_model, layers=a.layers, heads=a.heads, context=a.seq,
               attn_bias=True, norm_eps=1e-5, tied_head=True, ffn=ffn)
    model = torch_lm.LM(cfg)
    state = model.state_dict()
    weights = lm.weights()
    missing = set(state) - set(weights)
    extra = set(weights) - set(state)
    if missing or extra:
        sys.exit(f"names differ: only in PyTorch {sorted(missing)}, only in ffnlab {sorted(extra)}")
    with torch.no_grad():
        for name, (dims, raw) in weights.items():
            state[name].copy_(torch.frombuffer(bytearray(raw), dtype=torch.float32).view(dims))
    batches = ffnlab.training_batches(a.data, a.steps, a.batch, a.seq, a.seed)
    data = load(a.data)
    val = data[int(math.floor(len(data) * 0.9)):]

    settings = dict(steps=a.steps, batch=a.batch, seq=a.seq, seed=a.seed, warmup=a.warmup,
                    eval_every=max(0, a.eval_every), eval_tokens=0)
    ours = ffnlab.train(lm, a.data, progress=False, **settings)
    ffnlab_evals = {e["step"]: e["bits_per_byte"] for e in ours["evals"]}

    opt = torch_lm.optimizer(model, 3e-3, (0.9, 0.95), 0.1)
    print(f"{a.variant} seed {a.seed}, warm-up {a.warmup}: validation bits/byte (whole part)")
    print("step   ffnlab   PyTorch")
    for step, (ids, tgt) in enumerate(batches):
        ids = torch.frombuffer(bytearray(ids), dtype=torch.uint8).long()
        tgt = torch.frombuffer(bytearray(tgt), dtype=torch.uint8).long()
        for g in opt.param_groups:
            g["lr"] = torch_lm.lr_at(step, 3e-3, a.warmup, a.steps, 0.1)
        ce, aux = model(ids, tgt, a.seq)
        opt.zero_grad(set_to_none=True)
        (ce + aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done = step + 1
        if (a.eval_every > 0 and done % a.eval_every == 0) or done == a.steps:
            print(f"{done:4d}   {ffnlab_evals[done]:.4f}   "
                  f"{validation_bits(model, val, a.seq, a.batch):.4f}", flush=True)


if __name__ == "__main__":
    main()
