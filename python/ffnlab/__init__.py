"""ffnlab's FFN and Mixture-of-Experts layers from Python (docs/python.md).

    import numpy as np, ffnlab
    layer = ffnlab.FFN(variant="swiglu", d_model=512, d_ff=1376, bias=False)
    y = layer.forward(np.random.rand(8, 512).astype(np.float32), train=True)
    dx = layer.backward(np.ones_like(y))
    layer.grads()["down_proj.weight"]  # a numpy view of the gradient

ffnlab.torch wraps a layer as a torch.nn.Module (imported on demand: it needs torch).
"""
from ._ffnlab import (FFN, __version__, activation_names, config, from_hf, get_threads, params,
                      set_threads, variant_names)

__all__ = ["FFN", "__version__", "activation_names", "config", "from_hf", "get_threads", "params",
           "set_threads", "variant_names"]
