"""Golden training runs for tests/parity/test_train_golden.cpp: a tiny language model (2 layers,
d_model 32) is initialised in PyTorch (tests/parity/torch_lm.py), trained for 10 AdamW steps
(warm-up + cosine, clipping) on fixed batches, and its initial weights, batches, per-step losses
and final weights are written, for a dense SwiGLU model and for an MoE model (Mixtral-style
router with the load-balancing loss)."""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import torch_lm  # noqa: E402
from make_golden import save_safetensors  # noqa: E402

STEPS, B, S, V, D = 10, 4, 8, 64, 32
LR, WARMUP, MIN_RATIO, WD, BETAS, CLIP = 1e-2, 3, 0.1, 0.1, (0.9, 0.95), 1.0


def run(out, name, ffn, seed):
    torch.manual_seed(seed)
    cfg = dict(vocab=V, d_model=D, layers=2, heads=4, context=S, attn_bias=True, norm_eps=1e-5,
               tied_head=True, ffn=ffn)
    model = torch_lm.LM(cfg).double()
    # Larger embeddings than GPT-2's 0.02, so that ten steps move the loss visibly.
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0, 0.5)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, V, (STEPS, B * S), generator=gen)
    targets = (ids * 7 + 3) % V  # a learnable map, so the loss falls
    opt = torch_lm.optimizer(model, LR, BETAS, WD)
    losses = []
    for step in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = torch_lm.lr_at(step, LR, WARMUP, STEPS, MIN_RATIO)
        ce, aux = model(ids[step], targets[step], S)
        losses.append(ce.item() + aux.item())
        opt.zero_grad()
        (ce + aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
    tensors = {f"init.{k}": v for k, v in init.items()}
    tensors.update({f"final.{k}": v for k, v in model.state_dict().items()})
    tensors["ids"] = ids.double()
    tensors["targets"] = targets.double()
    tensors["losses"] = torch.tensor(losses, dtype=torch.float64)
    save_safetensors(os.path.join(out, f"train_{name}.safetensors"), tensors)
    meta = dict(steps=STEPS, batch=B, seq=S, lr=LR, warmup=WARMUP, min_lr_ratio=MIN_RATIO,
                weight_decay=WD, betas=BETAS, clip=CLIP, model=cfg)
    with open(os.path.join(out, f"train_{name}.json"), "w") as f:
        json.dump(meta, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    run(args.out, "dense_swiglu", dict(kind="glu", act="silu", d_ff=48, bias=True), 11)
    run(args.out, "moe", dict(kind="moe", act="silu", d_ff=24, experts=4, top_k=2, aux_coef=0.02), 12)
    print(f"make_train_golden: wrote 2 training runs to {args.out}")


if __name__ == "__main__":
    main()
