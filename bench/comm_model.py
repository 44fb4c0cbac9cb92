#!/usr/bin/env python3
"""The communication model of ffnlab's data- and expert-parallel training (docs/distributed.md).

Bytes each rank sends per optimizer step, and what they cost on a network of a given bandwidth
against the step's compute, for a byte-level Transformer LM whose FFNs are MoE layers of plain
(two-matrix) experts, as `ffnlab train --variant moe` builds it.

  gradient all-reduce (ring):   2 (P-1)/P * 4 * N_reduced            N_reduced = N, or N - N_experts
                                                                       with expert parallelism
  expert gradients (EP in groups of G < P): 2 (R-1)/R * 4 * N_experts / G over the R = P/G
                                replicas of each expert (one holder in each group)
  expert all-to-alls (EP only): 4 exchanges (dispatch, combine; forward and backward)
                                * L * A * T * k * D * 4 bytes * (G-1)/G  (rows whose expert is on
                                another rank of the group; T tokens per rank per micro-batch,
                                uniform routing; G = P without groups)
  compute per rank:             A * T * (6 * N_active + 12 * L * S * D) FLOPs

Usage: comm_model.py                   the table of docs/distributed.md
       comm_model.py --check ARGS      the bytes per step `ffnlab train ARGS` should report for
                                       --ranks P (2) in expert groups of --expert-group G
                                       (compared with what rank 0 printed)
Standard library only.
"""
import argparse


def params(D, L, E, F, V=256, context=128, k=2):
    """Parameter counts of ffnlab's TransformerLM with MoE FFNs (biases on, learned positions,
    tied head, LayerNorm): (total, experts, active per token)."""
    attn = 4 * D * D + 4 * D
    norms = 2 * 2 * D
    expert = 2 * D * F + F + D
    router = E * D + E  # gate.weight and gate.bias
    per_layer = attn + norms + router + E * expert
    total = V * D + context * D + L * per_layer + 2 * D
    experts = L * E * expert
    active = total - experts + L * k * expert - V * D - context * D
    return total, experts, active


def step(D, L, E, F, k, S, tokens, A, P, gbits, flops, ep, V=256, G=None):
    """G: the expert group (ranks the experts are split over; None: all P)."""
    total, experts, active = params(D, L, E, F, V, S, k)
    G = P if G is None else G
    R = P // G  # replicas of each expert
    reduced = total - experts if ep else total
    allreduce = 2 * (P - 1) / P * 4 * reduced
    # The experts' sum over their replicas runs after backward (ffnlab does not overlap it).
    replicas = 2 * (R - 1) / R * 4 * experts / G if ep and R > 1 else 0.0
    a2a = (4 * L * A * tokens * k * D * 4 * (G - 1) / G) if ep else 0.0
    compute = A * tokens * (6 * active + 12 * L * S * D) / flops
    bw = gbits * 1e9 / 8
    t_ar, t_rep, t_a2a = allreduce / bw, replicas / bw, a2a / bw
    # No overlap: every byte waits. Overlapped: the all-reduce hides behind backward (2/3 of
    # the compute); the all-to-alls sit between products and do not, nor does the replicas' sum.
    eff_none = compute / (compute + t_ar + t_rep + t_a2a)
    eff_overlap = compute / (compute + t_a2a + t_rep + max(0.0, t_ar - 2 / 3 * compute))
    return dict(total=total, experts=experts, allreduce=allreduce + replicas, a2a=a2a,
                compute=compute, t_ar=t_ar + t_rep, t_a2a=t_a2a, eff_none=eff_none,
                eff_overlap=eff_overlap)


def table(args):
    models = [
        ("ffnlab train --variant moe (D 128, L 4, E 8, F 512, k 2)", 128, 4, 8, 512, 2, 128),
        ("Mixtral-8x7B-like layers (D 4096, L 32, E 8, F 14336, k 2)", 4096, 32, 8, 14336, 2,
         4096),
    ]
    print(f"compute per rank: {args.flops / 1e9:.0f} GFLOP/s; {args.tokens} tokens per rank per "
          f"step (weak scaling)")
    for name, D, L, E, F, k, S in models:
        print(f"\n{name}, sequence {S}")
        print("| ranks | network | parallel | sent/rank/step | comm floor | compute | "
              "efficiency (no overlap) | (all-reduce overlapped) |")
        print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
        for P in (8, 64, 512):
            for g in (25, 100):
                # DP; DP+EP over groups of E ranks (one expert a rank), P/E replicas of each.
                for ep in (False, True):
                    G = min(P, E)
                    r = step(D, L, E, F, k, S, args.tokens, 1, P, g, args.flops, ep, G=G)
                    layout = "DP" if not ep else (
                        "DP+EP" if G == P else f"DP+EP, groups of {G} ({P // G} replicas)")
                    print(f"| {P} | {g} Gbit/s | {layout} | "
                          f"{(r['allreduce'] + r['a2a']) / 1e6:,.1f} MB | "
                          f"{(r['t_ar'] + r['t_a2a']) * 1e3:,.1f} ms | "
                          f"{r['compute'] * 1e3:,.0f} ms | {r['eff_none']:.1%} | "
                          f"{r['eff_overlap']:.1%} |")


def check(args):
    # What rank 0 of P hands to the exchanges per step: the gradient buffer once (the payload;
    # MPI's ring moves 2(P-1)/P of it), and the rows leaving the rank.
    total, experts, _ = params(args.d_model, args.layers, args.experts, args.d_ff,
                               context=args.seq, k=args.top_k)
    P = args.ranks
    G = args.expert_group or P
    grad = 4 * (total - experts if args.ep else total)
    if args.ep and G < P:  # this rank's experts' gradients, summed over their replicas
        grad += 4 * experts / G
    rows = args.batch // P * args.seq * args.accumulate * args.top_k
    # per exchange name: forward + backward, the rows whose expert is on another rank of the group
    a2a = 2 * args.layers * rows * args.d_model * 4 * (G - 1) / G
    print(f"parameters {total} (experts {experts})")
    print(f"gradient {grad / 1e6:.3f} MB per step")
    if args.ep:
        print(f"expert dispatch {a2a / 1e6:.3f} MB, expert combine {a2a / 1e6:.3f} MB per step "
              f"(uniform routing)")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flops", type=float, default=172e9,
                   help="compute per rank, FLOP/s (default: this machine's 2-thread oneDNN "
                        "f32 product rate, docs/design.md)")
    p.add_argument("--tokens", type=int, default=2048, help="tokens per rank per step")
    p.add_argument("--check", action="store_true")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--d-ff", type=int, default=512)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--ep", action="store_true")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--expert-group", type=int, default=0, help="0: every rank")
    args = p.parse_args()
    check(args) if args.check else table(args)


if __name__ == "__main__":
    main()
