"""No growth of memory over 10,000 calls: every array that crosses is released, and the layer
reuses its workspaces."""
import gc
import os

import numpy as np
import torch

import ffnlab
import ffnlab.torch as ft


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def growth(step, calls=10_000):
    for _ in range(200):  # warm-up: workspaces, primitives, allocator pools
        step()
    gc.collect()
    before = rss_bytes()
    for _ in range(calls):
        step()
    gc.collect()
    return rss_bytes() - before


def test_numpy_calls_do_not_grow_memory():
    layer = ffnlab.FFN(variant="moe", d_model=32, d_ff=64,
                       moe={"num_experts": 4, "top_k": 2, "aux_coef": 0.01})
    x = np.random.default_rng(0).standard_normal((16, 32), dtype=np.float32)

    def step():
        y = layer.forward(x, train=True)
        layer.backward(y)
        layer.grads()
        layer.stats()

    # 10,000 leaked [16, 32] outputs alone would be 20 MB.
    assert growth(step) < 4 * 2**20


def test_torch_wrapper_calls_do_not_grow_memory():
    block = ft.FFN(variant="swiglu", d_model=32, d_ff=64)
    x = torch.randn(16, 32, requires_grad=True)

    def step():
        block(x).sum().backward()

    assert growth(step) < 4 * 2**20
