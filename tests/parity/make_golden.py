#!/usr/bin/python3
"""Writes PyTorch golden cases for every dense FFN variant (tests/parity/).

Each case is a folder holding config.json (ffnlab's own format or a Hugging Face config.json),
weights.safetensors (Hugging Face names, optionally under a prefix), x.safetensors, dy.safetensors
and expected.safetensors (y, dx and every parameter gradient under its file name). The reference
is computed in float64 from the float32 values stored in the files. Run by the build, once.
"""
import argparse
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

def save_safetensors(path, tensors, as_dtype=None):
    """Minimal safetensors writer (F32, F16 and BF16), so that the golden files do not depend on
    ffnlab's own writer. as_dtype maps a name to 'BF16' or 'F16' for storage in that type."""
    as_dtype = as_dtype or {}
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().to(torch.float32).contiguous()
        kind = as_dtype.get(name, "F32")
        if kind == "F32":
            blob = t.numpy().astype(np.float32).tobytes()
        elif kind == "F16":
            blob = t.to(torch.float16).numpy().tobytes()
        elif kind == "BF16":
            blob = t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        else:
            raise ValueError(kind)
        header[name] = {"dtype": kind, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def activation(name, beta=1.0):
    return {
        "relu": F.relu,
        "gelu": F.gelu,
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "gelu_quick": lambda x: x * torch.sigmoid(1.702 * x),
        "silu": (lambda x: F.silu(x)) if beta == 1.0 else (lambda x: x * torch.sigmoid(beta * x)),
        "sigmoid": torch.sigmoid,
        "tanh": torch.tanh,
        "relu2": lambda x: F.relu(x) ** 2,
        "identity": lambda x: x,
    }[name]


GLU_VARIANTS = {"glu": "sigmoid", "bilinear": "identity", "reglu": "relu", "geglu": "gelu",
                "swiglu": "silu"}
HF_ACT = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu",
          "gelu_quick": "quick_gelu", "relu2": "relu2"}


def linear_params(gen, out_f, in_f, bias):
    bound = 1.0 / math.sqrt(in_f)
    w = (torch.rand(out_f, in_f, generator=gen, dtype=torch.float64) * 2 - 1) * bound
    b = (torch.rand(out_f, generator=gen, dtype=torch.float64) * 2 - 1) * bound if bias else None
    return w.float(), (b.float() if b is not None else None)


def make_case(out_dir, name, kind, act, D, Fh, T, bias, layout="separate", branches=1, beta=1.0,
              hf=None, prefix="", store=None, seed=0):
    """kind: plain | glu | multi_branch. hf: None, 'llama' or 'chatglm' (writes a HF config)."""
    gen = torch.Generator().manual_seed(seed)
    params = {}  # file name -> float32 tensor, in layer order
    if kind == "plain":
        up = "dense_h_to_4h" if layout == "fused" else "up_proj"
        down = "dense_4h_to_h" if layout == "fused" else "down_proj"
        ins = [up]
    elif kind == "glu":
        down = "dense_4h_to_h" if layout == "fused" else "down_proj"
        ins = ["dense_h_to_4h"] if layout == "fused" else ["gate_proj", "up_proj"]
    else:
        down = "down_proj"
        ins = [f"branches.{b}.{p}" for b in range(branches) for p in ("gate_proj", "up_proj")]
    rows = {"plain": Fh, "glu": 2 * Fh if layout == "fused" else Fh, "multi_branch": Fh}[kind]
    for n in ins:
        w, b = linear_params(gen, rows, D, bias)
        params[n + ".weight"] = w
        if bias:
            params[n + ".bias"] = b
    w, b = linear_params(gen, D, Fh, bias)
    params[down + ".weight"] = w
    if bias:
        params[down + ".bias"] = b
    # What the layer computes uses the values as stored (rounded when stored in BF16/F16).
    store = store or {}
    stored = {}
    for n, t in params.items():
        kind_ = store.get(n, "F32")
        stored[n] = t.to(torch.bfloat16 if kind_ == "BF16" else torch.float16).float() \
            if kind_ != "F32" else t
    x = torch.randn(T, D, generator=gen, dtype=torch.float64).float()
    dy = torch.randn(T, D, generator=gen, dtype=torch.float64).float()

    p64 = {n: t.double().requires_grad_(True) for n, t in stored.items()}
    x64 = x.double().requires_grad_(True)
    fn = activation(act, beta)

    def lin(n, inp):
        return F.linear(inp, p64[n + ".weight"], p64.get(n + ".bias"))

    if kind == "plain":
        h = fn(lin(ins[0], x64))
    elif kind == "glu":
        if layout == "fused":
            g, u = lin("dense_h_to_4h", x64).chunk(2, dim=-1)  # ChatGLM's swiglu
        else:
            g, u = lin("gate_proj", x64), lin("up_proj", x64)
        h = fn(g) * u
    else:
        h = sum(fn(lin(f"branches.{b}.gate_proj", x64)) * lin(f"branches.{b}.up_proj", x64)
                for b in range(branches))
    y = lin(down, h)
    (y * dy.double()).sum().backward()

    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    if hf == "llama":
        cfg = {"model_type": "llama", "hidden_size": D, "intermediate_size": Fh,
               "hidden_act": HF_ACT[act], "mlp_bias": bias, "num_hidden_layers": 4}
    elif hf == "chatglm":
        cfg = {"model_type": "chatglm", "hidden_size": D, "ffn_hidden_size": Fh,
               "add_bias_linear": bias}
    else:
        cfg = {"kind": kind, "activation": act, "d_model": D, "d_ff": Fh, "bias": bias,
               "layout": layout}
        if kind == "multi_branch":
            cfg["branches"] = branches
        if beta != 1.0:
            cfg["swish_beta"] = beta
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    save_safetensors(os.path.join(d, "weights.safetensors"),
                     {prefix + n: t for n, t in params.items()},
                     {prefix + n: k for n, k in store.items()})
    save_safetensors(os.path.join(d, "x.safetensors"), {"x": x})
    save_safetensors(os.path.join(d, "dy.safetensors"), {"dy": dy})
    expected = {"y": y.detach(), "dx": x64.grad}
    for n in params:
        expected[prefix + n] = p64[n].grad
    save_safetensors(os.path.join(d, "expected.safetensors"), expected)
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump({"prefix": prefix, "tokens": T}, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = args.out
    os.makedirs(out, exist_ok=True)
    seed = 0
    D, Fh, T = 13, 37, 7  # awkward: not multiples of 8 or 16

    def case(*a, **k):
        nonlocal seed
        seed += 1
        make_case(out, *a, seed=seed, **k)

    for act in ["relu", "gelu", "gelu_tanh", "gelu_quick", "silu", "sigmoid", "tanh", "relu2",
                "identity"]:
        case(f"plain_{act}_bias", "plain", act, D, Fh, T, True)
    case("plain_swish_beta1.5_nobias", "plain", "silu", D, Fh, T, False, beta=1.5)
    case("plain_relu_nobias_T1", "plain", "relu", D, Fh, 1, False)
    case("plain_gelu_fused_names", "plain", "gelu", D, Fh, T, True, layout="fused")
    for variant, act in GLU_VARIANTS.items():
        for layout in ["separate", "fused"]:
            for bias in [True, False]:
                case(f"{variant}_{layout}_{'bias' if bias else 'nobias'}", "glu", act, D, Fh, T,
                     bias, layout=layout)
    case("swiglu_separate_T1", "glu", "silu", 24, 19, 1, False)
    case("swiglu_wide_T33", "glu", "silu", 64, 172, 33, False)
    case("gated_3branches_bias", "multi_branch", "sigmoid", D, Fh, T, True, branches=3)
    case("gated_2branches_gelu_nobias_T1", "multi_branch", "gelu", D, Fh, 1, False, branches=2)
    case("hf_llama_prefix", "glu", "silu", 16, 43, 5, False, hf="llama",
         prefix="model.layers.3.mlp.")
    case("hf_llama_gelu_tanh_bias", "glu", "gelu_tanh", D, Fh, T, True, hf="llama")
    case("hf_chatglm_prefix", "glu", "silu", 16, 29, 6, True, layout="fused", hf="chatglm",
         prefix="transformer.encoder.layers.0.mlp.")
    case("hf_llama_bf16_f16_weights", "glu", "silu", D, Fh, T, False, hf="llama",
         store={"gate_proj.weight": "BF16", "up_proj.weight": "F16"})
    with open(os.path.join(out, "stamp"), "w") as f:
        f.write(f"{seed} cases\n")
    print(f"make_golden: wrote {seed} cases to {out}")


if __name__ == "__main__":
    main()
