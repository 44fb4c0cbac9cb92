"""ffnlab layers inside PyTorch models (docs/python.md).

    import ffnlab.torch
    block = ffnlab.torch.FFN(variant="swiglu", d_model=512, d_ff=1376, bias=False)
    y = block(x)                       # x: float32 [..., d_model], CPU
    loss = criterion(y) + block.aux_loss   # MoE: the auxiliary loss, differentiable
    loss.backward()                    # gradients reach block's parameters and x

    mlp = ffnlab.torch.from_module(hf_model.model.layers[0].mlp)   # LLaMA MLP, Mixtral MoE block

The parameters are torch tensors sharing memory with ffnlab's own buffer (no copy per step), so
any torch optimizer updates the weights ffnlab reads. Their .grad tensors share memory with
ffnlab's gradient buffer: ffnlab's backward accumulates into .grad directly, as autograd would
(no copy per step either). optimizer.zero_grad() works with set_to_none either way: a .grad of
None is re-attached to the buffer, zeroed, in the next backward. Gradient hooks on these
parameters do not run (autograd does not deliver their gradients).
"""
import operator
import threading
import warnings

import torch

from . import _ffnlab

__all__ = ["FFN", "from_module"]


def _unshared(what):
    """The refusal of `what`, a phrase that ends '... gives' or '... would give'."""
    return RuntimeError(
        f"[python] ffnlab.torch.FFN: its parameters and buffers are ffnlab's own float32 CPU "
        f"memory, which the layer computes with; {what} the module tensors the layer never reads "
        f"(its weights would stop following the optimizer and loaded values). Keep the module "
        f"float32 on the CPU; copy.deepcopy(module) makes an independent copy")


def _rebuilt(layer, router_logits, training, requires_grad, grads):
    """An FFN module around `layer` (a copy, from pickle or copy.deepcopy) as FFN.__reduce_ex__
    described the original."""
    module = FFN(layer=layer, router_logits=router_logits)
    module.train(training)
    for p, buffer, wants, grad in zip(module._params, module._grad_buffers, requires_grad, grads):
        p.requires_grad_(wants)
        if isinstance(grad, str):  # "buffer": the grad was ffnlab's buffer, copied with the layer
            p.grad = buffer
        elif grad is not None:
            p.grad = grad
    return module


def _rows(t, width):
    """t as a C-contiguous float32 [rows, width] tensor without autograd history."""
    flat = t.detach().reshape(-1, width)
    return flat if flat.is_contiguous() else flat.contiguous()


class _Function(torch.autograd.Function):
    """y, aux, logits = ffnlab layer(x, gate_residual). The parameters are inputs so that y
    requires grad when they do; their gradients go straight into their .grad
    (FFN._attach_grads), not through autograd. logits (what the next layer's gating residual
    takes, or what the module returns with router_logits=True) is [..., E], or empty when the
    module returns none."""

    @staticmethod
    def forward(ctx, x, residual, token_ids, first, module, train, stochastic, *params):
        with module._lock:  # the forward and what it left (its number, aux loss, logits)
            return _Function._forward(ctx, x, residual, token_ids, first, module, train,
                                      stochastic)

    @staticmethod
    def _forward(ctx, x, residual, token_ids, first, module, train, stochastic):
        layer = module.layer
        shape = x.shape
        flat = _rows(x, shape[-1])
        # [..., S, D]: sequences of S (what expert-choice routing routes each on its own)
        sequence = shape[-2] if x.dim() >= 3 else 0
        res = None if residual is None else _rows(residual, residual.shape[-1]).numpy()
        ids = None if token_ids is None else token_ids.reshape(-1).numpy()
        y = layer.forward(flat.numpy(), train=train, sequence=sequence, gate_residual=res,
                          token_ids=ids, first=first, stochastic=stochastic)
        # The layer reads x's (and the residual's) memory again in backward: saved, so that
        # autograd refuses a backward after they were changed in place, as for its own ops.
        ctx.save_for_backward(x, residual)
        ctx.module = module
        ctx.forward_count = layer.forward_count
        ctx.shape = shape
        ctx.residual_shape = None if residual is None else residual.shape
        aux = torch.tensor(layer.aux_loss if train else 0.0, dtype=x.dtype)
        logits = torch.zeros(0, dtype=x.dtype)
        if module.returns_logits:
            logits = torch.from_numpy(layer.logits)
            logits = logits.reshape(*shape[:-1], logits.shape[-1])
        return torch.from_numpy(y).reshape(shape), aux, logits

    @staticmethod
    def backward(ctx, dy, daux, dlogits):
        if torch.is_grad_enabled():  # backward(create_graph=True): a graph of the gradient
            raise RuntimeError(
                "[python] ffnlab.torch.FFN has no second derivative: backward with "
                "create_graph=True (double backward, gradient penalties) would silently drop the "
                "layer's second-order terms; take that gradient without create_graph, or use a "
                "PyTorch FFN where second derivatives are needed")
        _ = ctx.saved_tensors  # autograd's check: x and the residual as forward read them
        with ctx.module._lock:  # no other thread's forward between the check and the backward
            return _Function._backward(ctx, dy, daux, dlogits)

    @staticmethod
    def _backward(ctx, dy, daux, dlogits):
        layer = ctx.module.layer
        if layer.forward_count != ctx.forward_count:
            raise RuntimeError(
                "[python] ffnlab.torch.FFN: backward of a forward that is not the layer's last "
                "(the layer keeps one forward's activations; call each FFN module once per "
                "backward, or use one module per call site)")
        layer.set_aux_loss_scale(float(daux))
        ctx.module._attach_grads()
        g = _rows(dy.float(), ctx.shape[-1])
        dl = None
        if ctx.module.returns_logits and dlogits is not None and dlogits.numel() > 0:
            dl = _rows(dlogits.float(), dlogits.shape[-1]).numpy()
        dx = torch.from_numpy(layer.backward(g.numpy(), dlogits=dl)).reshape(ctx.shape)
        dres = None
        if ctx.residual_shape is not None:
            dres = torch.from_numpy(layer.gate_residual_grad).reshape(ctx.residual_shape)
        # The parameters' gradients are already in their .grad (ffnlab's buffer): nothing for
        # autograd to accumulate.
        return (dx, dres, None, None, None, None, None, *(None for _ in ctx.module._names))


class FFN(torch.nn.Module):
    """An ffnlab FFN or MoE layer as a torch.nn.Module (float32, CPU).

    FFN(config=None, seed=0, **keys) takes the same config as ffnlab.FFN; FFN(layer=...) wraps an
    existing ffnlab.FFN. A layer with MoE++'s gating_residual returns (y, logits) from
    forward(x, gate_residual=None, first=False): pass one layer's logits as the next layer's
    gate_residual, and first=True to the first (which has none), as MoE++'s model does;
    gradients flow back through both. router_logits=True makes an MoE return (y, logits
    [tokens, E]) as Hugging Face's sparse MoE blocks do, for a loss on them (their balancing
    loss), whose gradient reaches the router.
    forward(x, token_ids=...) hands hash routing the tokens' ids (an integer tensor of x's
    leading shape; other layers refuse them). FFN(layer=...) takes no config, seed or keys.
    The layer keeps what backward needs where autograd will call it, and routes as in training
    (router jitter, gate noise, BASE's assignment, the load the balancing bias follows) only in
    module.training: after .eval() a forward with gradients routes as at inference. Under
    torch.no_grad() (no backward to come) it routes as at inference in either mode, where
    torch's Dropout would still drop: call .eval() for evaluation all the same. Parameters
    are registered under their Hugging Face names with '.' replaced by '_'
    (named_ffn_parameters() gives the Hugging Face names). State that no
    optimizer may move (the MoE's aux-loss-free balancing bias, ReLU routing's L1 coefficient)
    is a buffer, not a parameter.
    """

    def __init__(self, config=None, seed=0, layer=None, router_logits=False, **keys):
        super().__init__()
        if layer is not None and (config is not None or seed != 0 or keys):
            raise ValueError("[python] ffnlab.torch.FFN: layer= wraps a built layer; config, "
                             "seed and keys build one, so give one or the other")
        self.layer = layer if layer is not None else _ffnlab.FFN(config, seed=seed, **keys)
        # Held by a forward until its number and outputs are read, and by a backward from its
        # check to its end: threads sharing the module cannot slip a forward in between.
        self._lock = threading.Lock()
        values, trainable = self.layer.parameters(), self.layer.trainable()
        self._names = [n for n in values if trainable[n]]
        for name in values:
            # from_numpy shares the memory: an optimizer step writes ffnlab's weights in place.
            t = torch.from_numpy(values[name])
            if trainable[name]:
                self.register_parameter(name.replace(".", "_"), torch.nn.Parameter(t))
            else:
                self.register_buffer(name.replace(".", "_"), t)
        self.aux_loss = torch.zeros(())
        config = self.layer.config
        self.gating_residual = bool(config.get("moe", {}).get("gating_residual", False))
        self.router_logits = bool(router_logits)
        if self.router_logits and not self.layer.has_router_logits:
            raise ValueError("[python] ffnlab.torch.FFN: router_logits=True returns an MoE "
                             "router's logits; this layer has none (a dense layer, or hash or "
                             "soft routing)")
        self.returns_logits = self.gating_residual or self.router_logits
        # ffnlab's buffers never move: the parameters and their gradient views, once.
        self._params = [getattr(self, n.replace(".", "_")) for n in self._names]
        grads = self.layer.grads()
        self._grad_buffers = [torch.from_numpy(grads[n]) for n in self._names]
        # Every parameter and buffer as registered, and its memory: a forward refuses a module
        # whose tensors were replaced (assigned, parametrized), a training forward also one whose
        # tensor's memory was (.data =). (Identity is a C-level pass; the addresses cost a call a
        # tensor, ~20 us a forward for 64 experts' 258 tensors, so inference skips them.)
        self._keys = [*self._parameters, *self._buffers]
        self._tensors = (*self._parameters.values(), *self._buffers.values())
        self._addresses = [t.data_ptr() for t in self._tensors]

    def _check_shared(self, train):
        now = (*self._parameters.values(), *self._buffers.values())
        if len(now) == len(self._tensors) and all(map(operator.is_, now, self._tensors)) and (
                not train or [t.data_ptr() for t in now] == self._addresses):
            return
        for key, t, address in zip(self._keys, self._tensors, self._addresses):
            current = self._parameters[key] if key in self._parameters else self._buffers.get(key)
            if current is not t or current.data_ptr() != address:
                raise _unshared(f"'{key}' was replaced (assigned, or its .data set), which gives")
        raise _unshared("a parameter or buffer was added, which gives")

    def _apply(self, fn, *args, **kwargs):
        # What a conversion does to a float32 CPU tensor, tried on one of its own first: .to(),
        # .double(), .half(), to_empty() make a new tensor, share_memory() moves the memory in
        # place; either is refused before any of the module's tensors is touched. .float(),
        # .cpu() and .to() of float32 on the CPU keep the tensor, and pass.
        probe = torch.zeros(1)
        where = probe.data_ptr()
        if fn(probe) is not probe or probe.data_ptr() != where:
            raise _unshared("this conversion of the module or of one that holds it (.to(), "
                            ".double(), .half(), share_memory(); modules converted before this "
                            "one stay converted) would give")
        return super()._apply(fn, *args, **kwargs)

    def share_memory(self):
        raise _unshared("share_memory() would give")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args, **kwargs):
        # load_state_dict copies into the parameters (ffnlab's buffer) unless told to assign
        # (PyTorch 2.1 and later)
        if local_metadata.get("assign_to_params_buffers", False):
            raise _unshared("load_state_dict(assign=True) would give")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args, **kwargs)

    def __reduce_ex__(self, protocol):
        # pickle and copy.deepcopy: the layer as its own state (weights, gradients, buffers,
        # seed and settings; ffnlab.FFN's pickling), then a module built around the copy, in the
        # same mode, with the same requires_grad and .grad. Hooks are not copied.
        grads = []
        for p, buffer in zip(self._params, self._grad_buffers):
            if p.grad is None:
                grads.append(None)
            elif p.grad.data_ptr() == buffer.data_ptr():
                grads.append("buffer")
            else:
                grads.append(p.grad.detach().clone())
        return (_rebuilt, (self.layer, self.router_logits, self.training,
                           [p.requires_grad for p in self._params], grads))

    def _attach_grads(self):
        """Makes every parameter's .grad a view of ffnlab's gradient buffer, so that backward
        accumulates into it. A .grad that was None starts from zero; one that is another tensor
        (set by hand) has its value copied into the buffer first. A frozen parameter
        (requires_grad False) keeps its .grad as autograd leaves it: None stays None (an
        optimizer steps only the parameters that have one), and one that is the buffer, which
        backward goes on adding to, becomes a copy of it."""
        for p, buffer in zip(self._params, self._grad_buffers):
            if not p.requires_grad:
                if p.grad is not None and p.grad.data_ptr() == buffer.data_ptr():
                    p.grad = buffer.clone()
                continue
            if p.grad is not None and p.grad.data_ptr() == buffer.data_ptr():
                continue
            with torch.no_grad():
                if p.grad is None:
                    buffer.zero_()
                else:
                    buffer.copy_(p.grad)
            p.grad = buffer

    def named_ffn_parameters(self):
        """(Hugging Face name, parameter) pairs."""
        return [(n, getattr(self, n.replace(".", "_"))) for n in self._names]

    def forward(self, x, gate_residual=None, token_ids=None, first=False):
        if x.dtype != torch.float32 or x.device.type != "cpu":
            raise ValueError(f"[python] ffnlab.torch.FFN takes float32 CPU tensors, got "
                             f"{x.dtype} on {x.device}")
        if x.shape[-1] != self.layer.d_model:
            raise ValueError(f"[python] input has {x.shape[-1]} features, the layer "
                             f"{self.layer.d_model}")
        params = self._params
        # Training (the layer keeps its activations) only where autograd will call backward;
        # training-only routing (jitter, gate noise, BASE's assignment) as module.training says,
        # as PyTorch's own modules do: model.eval() with gradients routes as at inference.
        train = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params))
        self._check_shared(train)
        stochastic = train and self.training
        if gate_residual is not None and not self.gating_residual:
            raise ValueError("[python] gate_residual given, but the layer has no "
                             "gating_residual (MoE++) to take it")
        y, self.aux_loss, logits = _Function.apply(x, gate_residual, token_ids, first, self,
                                                   train, stochastic, *params)
        if self.router_logits and not self.gating_residual:
            return y, logits.reshape(-1, logits.shape[-1])
        return (y, logits) if self.returns_logits else y

    def after_optimizer_step(self):
        """MoE with the aux-loss-free balancing bias or ReLU routing (its adaptive L1
        coefficient): call once per optimizer step."""
        self.layer.after_optimizer_step()

    def stats(self):
        return self.layer.stats()


# torch and Hugging Face activation classes (lower-cased names) -> ffnlab's activation names.
# Every target must be one of the library's names: checked when this module is imported, so
# that a renamed or removed activation fails here, by name, not later inside a model.
_ACTIVATIONS = {"siluactivation": "silu", "silu": "silu", "relu": "relu", "geluactivation": "gelu",
                "gelu": "gelu", "newgeluactivation": "gelu_tanh", "pytorchgelutanh": "gelu_tanh",
                "quickgeluactivation": "gelu_quick", "sigmoid": "sigmoid", "tanh": "tanh",
                "relusquaredactivation": "relu2", "identity": "identity"}
_unknown = set(_ACTIVATIONS.values()) - set(_ffnlab.activation_names())
if _unknown:
    raise ImportError(f"[python] ffnlab.torch maps activations onto names the library does not "
                      f"have: {sorted(_unknown)} (known: {_ffnlab.activation_names()})")


def _act_name(act):
    """ffnlab's name of a torch activation module or function (Hugging Face's ACT2FN values)."""
    name = type(act).__name__.lower()
    if name == "gelu" and getattr(act, "approximate", "none") == "tanh":
        return "gelu_tanh"
    if name in _ACTIVATIONS:
        return _ACTIVATIONS[name]
    fn = getattr(act, "__name__", "")
    if fn in _ACTIVATIONS:
        return _ACTIVATIONS[fn]
    raise ValueError(f"[python] unsupported activation {act!r}")


def _copy_weights(ffn, state):
    for name, p in ffn.named_ffn_parameters():
        if name not in state:
            raise ValueError(f"[python] the block has no tensor '{name}'")
        src = state[name]
        if tuple(src.shape) != tuple(p.shape):
            raise ValueError(f"[python] '{name}' has shape {tuple(src.shape)}, ffnlab expects "
                             f"{tuple(p.shape)}")
        with torch.no_grad():
            p.copy_(src.float())


def from_module(block, seed=0):
    """An ffnlab.torch.FFN computing what `block` computes, with its weights copied.

    Recognised: a LLaMA-style MLP (gate_proj, up_proj, down_proj Linears and act_fn) and a
    Mixtral-style sparse MoE block (gate Linear, experts with w1, w2, w3 and act_fn, top_k). A
    block that returns (hidden, router_logits), as Hugging Face's Mixtral block does, gives a
    module that returns them too (router_logits=True), so that it takes the block's place in
    its decoder layer. The block's router jitter (Hugging Face's jitter_noise, which scales the
    experts' input too) is not copied: ffnlab's jitter scales the router's input alone, so a
    block with jitter is warned of, and trains without it.
    """
    state = block.state_dict()
    if all(hasattr(block, n) for n in ("gate_proj", "up_proj", "down_proj")):
        d_ff, d_model = block.up_proj.weight.shape
        config = {"kind": "glu", "activation": _act_name(block.act_fn), "d_model": d_model,
                  "d_ff": d_ff, "bias": block.up_proj.bias is not None}
    elif hasattr(block, "gate") and hasattr(block, "experts"):
        if getattr(block, "jitter_noise", 0.0):
            warnings.warn(f"[python] from_module: the block's jitter_noise = {block.jitter_noise} "
                          "is not copied (ffnlab's router jitter scales the router's input "
                          "alone, Hugging Face's the experts' too): the module trains without "
                          "jitter", stacklevel=2)
        expert = block.experts[0]
        d_ff, d_model = expert.w1.weight.shape
        top_k = getattr(block, "top_k", None) or getattr(block, "num_experts_per_tok")
        config = {"kind": "moe", "activation": _act_name(expert.act_fn), "d_model": d_model,
                  "d_ff": d_ff, "bias": False,
                  "moe": {"num_experts": len(block.experts), "top_k": int(top_k),
                          "expert_kind": "glu", "router_bias": block.gate.bias is not None,
                          "naming": "mixtral", "normalize": True}}
    else:
        raise ValueError(f"[python] from_module does not know {type(block).__name__}: it takes a "
                         "LLaMA-style MLP or a Mixtral-style sparse MoE block")
    ffn = FFN(config, seed=seed, router_logits=config["kind"] == "moe" and _returns_pair(block))
    _copy_weights(ffn, state)
    return ffn


def _returns_pair(block):
    """Whether the MoE block returns (hidden, router_logits): one token through it, in
    evaluation mode, without gradients, and without touching torch's random state."""
    weight = block.gate.weight
    was_training = block.training
    block.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = block(torch.zeros(1, 1, weight.shape[1], dtype=weight.dtype))
    finally:
        block.train(was_training)
    return isinstance(out, tuple) and len(out) == 2
