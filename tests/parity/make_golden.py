#!/usr/bin/python3
"""Writes PyTorch golden cases for every dense FFN variant and the MoE layer (tests/parity/).

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
import scipy.optimize
import torch
import torch.nn.functional as F

def save_safetensors(path, tensors, as_dtype=None):
    """Minimal safetensors writer (F32, F16, BF16 and I64), so that the golden files do not depend
    on ffnlab's own writer. as_dtype maps a name to 'BF16', 'F16' or 'I64' (whole numbers) for
    storage in that type."""
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
        elif kind == "I64":
            blob = t.to(torch.int64).numpy().tobytes()
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


def moe_param_names(m, kind, bias, D, Fe, Fs):
    """(name, shape, fan_in, is_bias) in ffnlab's declaration order, with the naming m['naming']."""
    E = m["num_experts"]
    C = m.get("constant_experts", 0)
    routed = E + C + m.get("copy_experts", 0) + m.get("zero_experts", 0)
    if m.get("routing") == "soft":  # Soft MoE: the slots' parameters and their scale
        out = [("gate.phi", (E * m.get("slots", 1), D), D, False), ("gate.scale", (1,), 1, False)]
    elif m.get("routing") == "hash":  # hash routing: no router parameters
        out = []
    else:
        out = [("gate.weight", (routed, D), D, False)]
        if m.get("router_bias", True):
            out.append(("gate.bias", (routed,), D, True))
    mixtral = m.get("naming") == "mixtral"
    ins = (["w1", "w3"] if mixtral else ["gate_proj", "up_proj"]) if kind == "glu" else ["up_proj"]
    down = "w2" if mixtral else "down_proj"
    for e in range(E):
        for n in ins:
            out.append((f"experts.{e}.{n}.weight", (Fe, D), D, False))
            if bias:
                out.append((f"experts.{e}.{n}.bias", (Fe,), D, True))
        out.append((f"experts.{e}.{down}.weight", (D, Fe), Fe, False))
        if bias:
            out.append((f"experts.{e}.{down}.bias", (D,), Fe, True))
    if m.get("num_shared", 0):
        pre = "shared_expert." if m.get("naming") == "qwen2_moe" else "shared_experts."
        for n in (["gate_proj", "up_proj"] if kind == "glu" else ["up_proj"]):
            out.append((pre + n + ".weight", (Fs, D), D, False))
            if bias:
                out.append((pre + n + ".bias", (Fs,), D, True))
        out.append((pre + "down_proj.weight", (D, Fs), Fs, False))
        if bias:
            out.append((pre + "down_proj.bias", (D,), Fs, True))
        if m.get("shared_gate"):
            out.append(("shared_expert_gate.weight", (1, D), D, False))
    out += [(f"constant_experts.{i}.vector", (D,), 1, False) for i in range(C)]
    out += [(f"constant_experts.{i}.gate.weight", (2, D), D, False) for i in range(C)]
    if m.get("gating_residual"):
        out.append(("gate.gate_map.weight", (routed, routed), routed, False))
    return out


def hash_key(token_id, e):
    """Hash routing's key of expert e for a token id: splitmix64's finaliser of (id << 32 | e)."""
    mask = (1 << 64) - 1
    z = (((token_id << 32) | e) + 0x9e3779b97f4a7c15) & mask
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & mask
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & mask
    return z ^ (z >> 31)


def moe_reference(p, x, m, kind, act, bias, sequence=0, residual=None, token_ids=None):
    """The MoE block in float64 autograd, written from the papers' and HF's definitions
    (docs/moe.md). Returns y, balance loss, z-loss, entropy, L1 penalty, chosen experts [T, k],
    weights, kept and the router logits (None for Soft MoE).
    sequence: expert-choice routing's sequence length (0: all T tokens are one).
    residual: MoE++'s gating residual, the previous MoE layer's logits [T, E] (None: none)."""
    T, D = x.shape
    N, K = m["num_experts"], m.get("top_k", 2)  # (Soft MoE does not read top_k)
    # MoE++ (Jin et al. 2024): the router scores N FFN experts, then the zero-computation ones
    # in the order constant, copy, zero.
    C, n_copy = m.get("constant_experts", 0), m.get("copy_experts", 0)
    E = N + C + n_copy + m.get("zero_experts", 0)
    zero_from = N + C + n_copy
    fn = activation(act)
    mixtral = m.get("naming") == "mixtral"
    ins = (["w1", "w3"] if mixtral else ["gate_proj", "up_proj"]) if kind == "glu" else ["up_proj"]
    down = "w2" if mixtral else "down_proj"

    def mlp(pre, inp, names, down_name):
        lin = lambda n, z: F.linear(z, p[pre + n + ".weight"], p.get(pre + n + ".bias"))
        h = fn(lin(names[0], inp)) * lin(names[1], inp) if kind == "glu" else fn(lin(names[0], inp))
        return lin(down_name, h)

    def with_shared(y):
        if not m.get("num_shared", 0):
            return y
        pre = "shared_expert." if m.get("naming") == "qwen2_moe" else "shared_experts."
        s = mlp(pre, x, ["gate_proj", "up_proj"] if kind == "glu" else ["up_proj"], "down_proj")
        if m.get("shared_gate"):
            s = torch.sigmoid(F.linear(x, p["shared_expert_gate.weight"])) * s
        return y + s

    if m.get("routing") == "soft":
        # Soft MoE (Puigcerver et al. 2024), per sequence of S tokens: logits between the
        # l2-normalised tokens and scale·the l2-normalised slot parameters (ε 1e-6 on the sum
        # of squares, as vmoe's normalisation), dispatch = softmax over the tokens, combine =
        # softmax over the slots; expert j // p runs slot j. Nothing is chosen; no losses.
        S, slots = sequence or T, m.get("slots", 1)
        l2n = lambda v: v / torch.sqrt((v * v).sum(-1, keepdim=True) + 1e-6)
        xn, phin = l2n(x), p["gate.scale"] * l2n(p["gate.phi"])
        parts, entropy = [], torch.zeros((), dtype=torch.float64)
        for b in range(0, T, S):
            L = xn[b:b + S] @ phin.T  # [S, E·p]
            slot_in = torch.softmax(L, dim=0).T @ x[b:b + S]
            slot_out = torch.cat([mlp(f"experts.{j // slots}.", slot_in[j:j + 1], ins, down)
                                  for j in range(N * slots)])
            parts.append(torch.softmax(L, dim=1) @ slot_out)
            # The router entropy it reports: of each token's combine weights, mean over tokens.
            entropy = entropy - (torch.softmax(L, 1) * torch.log_softmax(L, 1)).sum().detach() / T
        zero, none = torch.zeros((), dtype=torch.float64), torch.zeros(T, 0)
        return with_shared(torch.cat(parts)), zero, zero, entropy, zero, none, none, none, None
    if m.get("routing") == "hash":
        # Roller et al. 2021: a token takes the K experts of highest hash_key(id, e), each
        # weighing 1 (1/K with normalize); capacity drops the later assignments. No losses.
        idx = torch.tensor([sorted(range(N), key=lambda e: -hash_key(int(i), e))[:K]
                            for i in token_ids])
        w = torch.full((T, K), (1.0 / K if m.get("normalize", True) else 1.0) *
                       m.get("scaling", 1.0), dtype=torch.float64)
        kept = torch.ones(T, K, dtype=torch.bool)
        c = m.get("capacity_factor", 0.0)
        if c > 0:
            cap = math.ceil(c * K * T / N)
            for e in range(N):
                lst = [(j, t) for j in range(K) for t in range(T) if idx[t, j] == e]
                for j, t in lst[cap:]:
                    kept[t, j] = False
            assert not kept.all(), "the capacity drops nothing: pick other values"
        y = torch.zeros(T, D, dtype=torch.float64)
        for e in range(N):
            tok, j = torch.nonzero((idx == e) & kept, as_tuple=True)
            if len(tok):
                out = mlp(f"experts.{e}.", x[tok], ins, down)
                y = y.index_add(0, tok, w[tok, j].unsqueeze(-1) * out)
        zero = torch.zeros((), dtype=torch.float64)
        return with_shared(y), zero, zero, zero, zero, idx, w, kept, None
    logits = F.linear(x, p["gate.weight"], p.get("gate.bias"))
    if residual is not None:
        # MoE++'s Router.forward: logits += gate_map(previous layer's logits), no bias.
        logits = logits + F.linear(residual, p["gate.gate_map.weight"])
    probs = torch.softmax(logits, dim=-1)
    scores = probs if m.get("score", "softmax") == "softmax" else torch.sigmoid(logits)
    sel = scores.detach().clone()
    if "gate.e_score_correction_bias" in p:
        sel = sel + p["gate.e_score_correction_bias"].detach()
    G = m.get("groups", 0)
    if G:
        size = E // G
        grouped = sel.view(T, G, size)
        gs = grouped.topk(min(2, size), dim=-1).values.sum(-1)
        keep = gs.topk(m["topk_groups"], dim=-1).indices
        gmask = torch.zeros(T, G, dtype=torch.bool).scatter_(1, keep, True)
        sel = sel.masked_fill(~gmask.repeat_interleave(size, dim=1), float("-inf"))
    relu_routing = m.get("routing", "topk") == "relu"
    if relu_routing:
        # ReMoE (Wang et al. 2025): gate = ReLU(logit) for every expert; a token takes those
        # that are positive. Columns: every expert, best logit first.
        K = E
        gap = logits.detach().abs().min()
        assert gap > 1e-4, f"a logit lies within {gap:.1e} of 0: pick other values"
        sel = logits.detach()
    expert_choice = m.get("routing", "topk") == "expert_choice"
    if expert_choice:
        # Expert choice (Zhou et al. 2022): in every sequence of S tokens each expert takes its
        # C = ceil(c·k·S/E) tokens of highest probability (c: capacity_factor, 1 when 0); a
        # token's columns are the experts that took it, best first, then the others.
        K = E
        S = sequence or T
        cap = min(S, max(1, math.ceil((m.get("capacity_factor", 0.0) or 1.0) * m["top_k"] * S / E)))
        took = torch.zeros(T, E, dtype=torch.bool)
        for b in range(0, T, S):
            ranked = torch.sort(probs.detach()[b:b + S], dim=0, descending=True, stable=True)
            if cap < S:
                gap = (ranked.values[cap - 1] - ranked.values[cap]).abs().min()
                assert gap > 1e-4, f"an expert's C-th and next token lie {gap:.1e} apart"
            took[b + ranked.indices[:cap], torch.arange(E)] = True
        # Sort key: taken first, then by probability (both descending; probabilities < 1).
        sel = took.double() * 2 + probs.detach()
    idx = torch.sort(sel, dim=-1, descending=True, stable=True).indices[:, :K]
    if m.get("routing", "topk") == "base":
        # BASE layers (Lewis et al. 2021), a training forward: the balanced linear assignment of
        # the batch (expert e takes T // E tokens, the first T % E one more) that maximises the
        # sum of the affinities, exactly: scipy's linear_sum_assignment over the experts' slots.
        # Weighted by σ(affinity) (score "sigmoid", unnormalised).
        a = logits.detach().numpy()
        cols = [e for e in range(N) for _ in range(T // N + (e < T % N))]
        rows, picked = scipy.optimize.linear_sum_assignment(a[:, cols], maximize=True)
        assert list(rows) == list(range(T))
        idx = torch.tensor([[cols[j]] for j in picked])
        greedy = a.argmax(-1)
        assert (idx[:, 0].numpy() != greedy).any(), "the balance changes nothing: pick others"
    # Top-p (Huang et al. 2024): the fewest best experts whose probabilities sum to at least
    # top_p, at most k; `taken` marks them.
    taken = torch.ones(T, K, dtype=torch.bool)
    if m.get("routing", "topk") == "top_p":
        mass = probs.detach().gather(1, idx).cumsum(-1)
        gap = (mass - m["top_p"]).abs().min()
        assert gap > 1e-4, f"a token's mass lies within {gap:.1e} of top_p: pick other values"
        reached = mass >= m["top_p"]
        count = torch.where(reached.any(-1), reached.double().argmax(-1) + 1, K)
        taken = torch.arange(K)[None, :] < count[:, None]
    if expert_choice:
        taken = took.gather(1, idx)
    if relu_routing:
        taken = logits.detach().gather(1, idx) > 0
        v = torch.relu(logits).gather(1, idx) * taken
    elif m.get("softmax_after_topk"):
        v = torch.softmax(logits.gather(1, idx), dim=-1)
    else:
        v = scores.gather(1, idx) * taken
    v = v * (idx < zero_from)  # a zero expert weighs nothing, before renormalising
    for e in range(N, E):  # the case exercises every zero-computation expert
        assert (idx == e).any(), f"no token chose zero-computation expert {e}: pick other values"
    w = v / v.sum(-1, keepdim=True) if m.get("normalize", True) and not relu_routing else v
    w = w * m.get("scaling", 1.0)
    # Capacity: per expert, first choices before second choices, then by token (position) or
    # by router probability (descending); the first `capacity` are kept. Zero-computation
    # choices run no FFN row: not kept.
    kept = taken & (idx < N)
    c = m.get("capacity_factor", 0.0)
    if c > 0 and not expert_choice:
        cap = math.ceil(c * K * T / E)
        for e in range(E):
            lst = [(j, t) for j in range(K) for t in range(T) if idx[t, j] == e and taken[t, j]]
            if m.get("drop", "position") == "probability":
                lst.sort(key=lambda jt: -float(scores[jt[1], e]))
            for j, t in lst[cap:]:
                kept[t, j] = False
    y = torch.zeros(T, D, dtype=torch.float64)
    for e in range(N):
        tok, j = torch.nonzero((idx == e) & kept, as_tuple=True)
        if len(tok) == 0:
            continue
        out = mlp(f"experts.{e}.", x[tok], ins, down)
        y = y.index_add(0, tok, w[tok, j].unsqueeze(-1) * out)
    for e in range(N, zero_from):  # constant: a·x + b·v, [a, b] = softmax(W_c·x); copy: x
        tok, j = torch.nonzero((idx == e) & taken, as_tuple=True)
        if len(tok) == 0:
            continue
        if e < N + C:
            ab = torch.softmax(F.linear(x[tok], p[f"constant_experts.{e - N}.gate.weight"]), -1)
            out = ab[:, :1] * x[tok] + ab[:, 1:] * p[f"constant_experts.{e - N}.vector"]
        else:
            out = x[tok]
        y = y.index_add(0, tok, w[tok, j].unsqueeze(-1) * out)
    y = with_shared(y)
    which = m.get("balance_loss", "topk")
    onehot = F.one_hot(idx, E).double() * taken.unsqueeze(-1)  # [T, K, E]
    onehot = (onehot[:, :1] if which == "top1" else onehot).sum(1)  # [T, E]
    f = onehot.mean(0) / (K if which == "topk_normalized" else 1)
    eta = torch.ones(E, dtype=torch.float64)  # MoE++'s heterogeneous weights: τ for zero-comp.
    eta[N:] = m.get("zc_balance_weight", 1.0)
    balance = E * (eta * f * probs.mean(0)).sum()
    z = torch.logsumexp(logits, dim=-1).pow(2).mean()
    entropy = -(probs * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
    # ReMoE's L1 penalty with its load balancing folded in, as its released code computes it
    # per layer: E/(top_k·T²)·Σ_e n_e·Σ_t gate_te, n_e = tokens with a positive gate (constant).
    l1 = torch.zeros((), dtype=torch.float64)
    if relu_routing:
        n = (logits.detach() > 0).double().sum(0)
        l1 = E * (n * torch.relu(logits).sum(0)).sum() / (m["top_k"] * T * T)
    return y, balance, z, entropy, l1, idx, w, kept, logits


def make_moe_case(out_dir, name, m, kind, act, D, Fe, T, bias, hf=None, prefix="", Fs=0, seed=0,
                  balance_bias=False, l1_coef=0.0, sequence=0):
    gen = torch.Generator().manual_seed(seed)
    params = {}
    for n, shape, fan_in, is_bias in moe_param_names(m, kind, bias, D, Fe, Fs):
        bound = 1.0 / math.sqrt(fan_in)
        params[n] = ((torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1)
                     * bound).float()
    if balance_bias:
        params["gate.e_score_correction_bias"] = (
            torch.randn(m["num_experts"], generator=gen, dtype=torch.float64) * 0.05).float()
    if m.get("routing") == "soft":  # a scale away from 1 (its initial value) to show in y
        params["gate.scale"] = torch.tensor([2.5], dtype=torch.float32)
    if m.get("routing") == "relu":  # the L1 coefficient: state, not trained
        params["gate.l1_coef"] = torch.tensor([l1_coef], dtype=torch.float32)
    x = torch.randn(T, D, generator=gen, dtype=torch.float64).float()
    dy = torch.randn(T, D, generator=gen, dtype=torch.float64).float()
    p64 = {n: t.double().requires_grad_(True) for n, t in params.items()}
    x64 = x.double().requires_grad_(True)
    # MoE++'s gating residual: the previous layer's logits come in with x, and the gradient the
    # next layer hands back for this layer's logits with dy.
    res64, dlogits = None, None
    if m.get("gating_residual"):
        routed = params["gate.weight"].shape[0]
        res64 = (torch.randn(T, routed, generator=gen, dtype=torch.float64) * 2).float() \
            .double().requires_grad_(True)
        dlogits = torch.randn(T, routed, generator=gen, dtype=torch.float64).float()
    ids = None
    if m.get("routing") == "hash":  # byte ids, as ffnlab's language model has
        ids = torch.randint(0, 256, (T,), generator=gen)
    y, balance, z, entropy, l1, idx, w, kept, logits = moe_reference(
        p64, x64, m, kind, act, bias, sequence, res64, ids)
    loss = (y * dy.double()).sum() + m.get("aux_coef", 0.0) * balance + m.get("z_coef", 0.0) * z \
        + m.get("entropy_coef", 0.0) * entropy + l1_coef * l1
    if dlogits is not None:
        loss = loss + (logits * dlogits.double()).sum()
    loss.backward()

    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    cfg = hf if hf else {"kind": "moe", "activation": act, "d_model": D, "d_ff": Fe, "bias": bias,
                         "moe": dict(m, expert_kind=kind)}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    save_safetensors(os.path.join(d, "weights.safetensors"),
                     {prefix + n: t for n, t in params.items()})
    # Sequences of `sequence` tokens are stored [B, S, D], as `ffnlab run` reads them.
    rows = (T // sequence, sequence, D) if sequence else (T, D)
    xs, dys = {"x": x.reshape(rows)}, {"dy": dy.reshape(rows)}
    if ids is not None:
        xs["token_ids"] = ids.float()
    if res64 is not None:
        xs["gate_residual"] = res64.detach().float()
        dys["dlogits"] = dlogits
    save_safetensors(os.path.join(d, "x.safetensors"), xs, {"token_ids": "I64"})
    save_safetensors(os.path.join(d, "dy.safetensors"), dys)
    expected = {"y": y.detach().reshape(rows), "dx": x64.grad.reshape(rows),
                "balance_loss": balance.detach().reshape(1),
                "z_loss": z.detach().reshape(1), "entropy": entropy.detach().reshape(1),
                "l1_loss": l1.detach().reshape(1),
                "experts": idx.double(),
                "expert_weights": w.detach(), "expert_kept": kept.double()}
    if res64 is not None:
        expected["logits"] = logits.detach()
        expected["dgate_residual"] = res64.grad
    for n in params:
        g = p64[n].grad
        expected[prefix + n] = g if g is not None else torch.zeros_like(p64[n])
    save_safetensors(os.path.join(d, "expected.safetensors"), expected)
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump({"prefix": prefix, "tokens": T, "moe": True, "sequence": sequence}, f)


def moe_cases(case):
    """The three Hugging Face semantics, Switch-style capacity, the tutorial's MoE, small T."""
    case("moe_hf_mixtral_e6_k2",
         {"num_experts": 6, "top_k": 2, "naming": "mixtral", "router_bias": False,
          "normalize": True, "aux_coef": 0.02}, "glu", "silu", 16, 24, 9, False,
         hf={"model_type": "mixtral", "hidden_size": 16, "intermediate_size": 24,
             "num_local_experts": 6, "num_experts_per_tok": 2, "hidden_act": "silu",
             "router_aux_loss_coef": 0.02, "router_jitter_noise": 0.0},
         prefix="model.layers.1.block_sparse_moe.")
    case("moe_hf_qwen2_moe_e7_k3_T5",
         {"num_experts": 7, "top_k": 3, "naming": "qwen2_moe", "router_bias": False,
          "normalize": False, "num_shared": 1, "shared_gate": True, "aux_coef": 0.001},
         "glu", "silu", 16, 12, 5, False, Fs=20,
         hf={"model_type": "qwen2_moe", "hidden_size": 16, "moe_intermediate_size": 12,
             "shared_expert_intermediate_size": 20, "num_experts": 7, "num_experts_per_tok": 3,
             "norm_topk_prob": False, "hidden_act": "silu", "router_aux_loss_coef": 0.001},
         prefix="model.layers.0.mlp.")
    case("moe_hf_deepseek_v3_e12_groups",
         {"num_experts": 12, "top_k": 3, "score": "sigmoid", "groups": 4, "topk_groups": 2,
          "scaling": 2.5, "normalize": True, "num_shared": 2, "router_bias": False},
         "glu", "silu", 16, 8, 10, False, Fs=16, balance_bias=True,
         hf={"model_type": "deepseek_v3", "hidden_size": 16, "moe_intermediate_size": 8,
             "n_routed_experts": 12, "num_experts_per_tok": 3, "n_shared_experts": 2,
             "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
             "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
             "hidden_act": "silu"},
         prefix="model.layers.3.mlp.")
    case("moe_switch_top1_capacity_zloss",
         {"num_experts": 5, "top_k": 1, "capacity_factor": 1.0, "balance_loss": "top1",
          "normalize": False, "aux_coef": 0.01, "z_coef": 0.001}, "plain", "relu", 13, 20, 16,
         True)
    case("moe_capacity_by_probability_k2",
         {"num_experts": 5, "top_k": 2, "capacity_factor": 0.8, "drop": "probability",
          "aux_coef": 0.01, "balance_loss": "topk_normalized"}, "plain", "gelu", 13, 20, 12,
         True)
    case("moe_seeds_relu_e8_k2",
         {"num_experts": 8, "top_k": 2, "aux_coef": 0.01}, "plain", "relu", 13, 37, 7, True)
    case("moe_k1_T3_fewer_tokens_than_experts",
         {"num_experts": 6, "top_k": 1, "z_coef": 0.01}, "plain", "gelu", 13, 20, 3, False)
    # Top-p routing (Huang et al. 2024): the paper's weights (the probabilities, not
    # renormalised) and dynamic loss; and renormalised, with capacity.
    case("moe_top_p_e6_cap4_dynamic_loss",
         {"num_experts": 6, "top_k": 4, "routing": "top_p", "top_p": 0.5, "normalize": False,
          "entropy_coef": 0.01, "aux_coef": 0.01}, "plain", "relu", 13, 20, 16, True)
    case("moe_top_p_capacity_swiglu_cap3",
         {"num_experts": 8, "top_k": 3, "routing": "top_p", "top_p": 0.4, "normalize": True,
          "capacity_factor": 0.8, "aux_coef": 0.01}, "glu", "silu", 13, 11, 14, False)
    # ReLU routing (ReMoE): every positive logit is a gate; the L1 penalty at a coefficient
    # large enough to show in every gradient.
    case("moe_relu_routing_e6_k2_l1",
         {"num_experts": 6, "top_k": 2, "routing": "relu", "normalize": False,
          "router_bias": False}, "plain", "relu", 13, 20, 16, True, l1_coef=0.3)
    case("moe_relu_routing_swiglu_scaled_sparsity",
         {"num_experts": 8, "top_k": 3, "routing": "relu", "normalize": False, "scaling": 1.5,
          "target_sparsity": 0.5}, "glu", "silu", 13, 11, 12, False, l1_coef=0.5)
    # MoE++ (Jin et al. 2024): two constant experts, a copy and a zero expert beside the FFN
    # experts, weighted by τ = 0.75 in the balance loss; and without renormalisation.
    case("moe_plus_plus_zero_copy_constant_e6_k2",
         {"num_experts": 6, "top_k": 2, "constant_experts": 2, "copy_experts": 1,
          "zero_experts": 1, "zc_balance_weight": 0.75, "router_bias": False, "aux_coef": 0.01},
         "glu", "silu", 13, 11, 24, False)
    case("moe_plus_plus_unnormalized_k3",
         {"num_experts": 5, "top_k": 3, "constant_experts": 1, "copy_experts": 1,
          "zero_experts": 1, "normalize": False, "aux_coef": 0.01}, "plain", "relu", 13, 20, 16,
         True)
    # Expert choice (Zhou et al. 2022): three sequences of 8, each expert taking ceil(2·8/4) = 4
    # tokens of each (GELU experts: a ReLU pre-activation near 0 may flip sign in the bf16
    # check); and one sequence of 14 with capacity factor 1.5 and the z-loss.
    case("moe_expert_choice_e4_k2_three_sequences",
         {"num_experts": 4, "top_k": 2, "routing": "expert_choice", "normalize": False},
         "plain", "gelu", 13, 20, 24, True, sequence=8)
    case("moe_expert_choice_swiglu_c1.5_zloss",
         {"num_experts": 6, "top_k": 2, "routing": "expert_choice", "normalize": False,
          "capacity_factor": 1.5, "z_coef": 0.01, "scaling": 1.2, "router_bias": False},
         "glu", "silu", 13, 11, 14, False)
    # Soft MoE (Puigcerver et al. 2024): two sequences of 6 with 4 experts of 2 slots and a
    # shared expert; one sequence of 9 with 3 experts of one slot.
    case("moe_soft_e4_p2_two_sequences_shared",
         {"num_experts": 4, "routing": "soft", "slots": 2, "num_shared": 1,
          "shared_d_ff": 9}, "glu", "silu", 13, 11, 12, False, Fs=9,
         sequence=6)
    # Hash layers (Roller et al. 2021): one expert a token by a fixed hash of its id; two a
    # token with a capacity that drops some, and a shared expert.
    case("moe_hash_e4_k1_swiglu",
         {"num_experts": 4, "top_k": 1, "routing": "hash"}, "glu", "silu", 13, 11, 16, True)
    case("moe_hash_e5_k2_capacity_shared",
         {"num_experts": 5, "top_k": 2, "routing": "hash", "capacity_factor": 1.0,
          "num_shared": 1, "shared_d_ff": 7}, "plain", "relu", 13, 10, 20, False, Fs=7)
    # BASE layers (Lewis et al. 2021): the balanced assignment of a training batch, 4 tokens an
    # expert; 11 tokens over 3 experts (4, 4, 3) with a router bias and a shared expert.
    base = {"routing": "base", "top_k": 1, "score": "sigmoid", "normalize": False}
    case("moe_base_e4_swiglu", dict(base, num_experts=4, router_bias=False), "glu", "silu",
         13, 11, 16, True)
    case("moe_base_e3_uneven_bias_shared",
         dict(base, num_experts=3, num_shared=1, shared_d_ff=7, z_coef=0.01, router_bias=True),
         "plain", "relu",
         13, 10, 11, False, Fs=7)
    case("moe_soft_e3_p1_gelu_bias",
         {"num_experts": 3, "routing": "soft", "slots": 1}, "plain", "gelu", 13, 20,
         9, True)
    case("moe_softmax_after_topk_geglu_k3",
         {"num_experts": 7, "top_k": 3, "softmax_after_topk": True, "aux_coef": 0.01},
         "glu", "gelu", 13, 11, 9, True)
    # MoE++'s gating residual: the previous layer's logits through gate_map, with the
    # zero-computation experts, and the gradient of this layer's logits from the next layer.
    case("moe_plus_plus_gating_residual_e4_k2",
         {"num_experts": 4, "top_k": 2, "constant_experts": 1, "copy_experts": 1,
          "zero_experts": 1, "gating_residual": True, "aux_coef": 0.01}, "glu", "silu", 13, 11,
         14, False)


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

    def moe_case(*a, **k):
        nonlocal seed
        seed += 1
        make_moe_case(out, *a, seed=seed, **k)

    moe_cases(moe_case)
    with open(os.path.join(out, "stamp"), "w") as f:
        f.write(f"{seed} cases\n")
    print(f"make_golden: wrote {seed} cases to {out}")


if __name__ == "__main__":
    main()
