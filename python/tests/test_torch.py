"""ffnlab.torch: the wrapped layer inside PyTorch models, trained with torch optimizers, against
the same models with PyTorch's own blocks."""
import copy

import numpy as np
import pytest
import torch
from torch import nn

import ffnlab
import ffnlab.torch as ft
from ffnlab.hf_blocks import LlamaMLP, MixtralSparseMoeBlock


class TinyLM(nn.Module):
    """Embedding -> (x + block(norm(x))) x 2 -> head: enough to train a few steps."""

    def __init__(self, make_block, vocab=32, d_model=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(2))
        self.blocks = nn.ModuleList(make_block() for _ in range(2))
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for norm, block in zip(self.norms, self.blocks):
            x = x + block(norm(x))
        return self.head(x)


def train(model, steps, extra_loss=None):
    torch.manual_seed(7)
    # SGD, not Adam: Adam's step does not see a wrong gradient scale.
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, 32, (4, 12))
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 32), tokens[:, 1:].reshape(-1))
        if extra_loss is not None:
            loss = loss + extra_loss(model)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def swap_blocks(model):
    swapped = copy.deepcopy(model)
    swapped.blocks = nn.ModuleList(ft.from_module(b) for b in model.blocks)
    return swapped


@pytest.mark.parametrize("make_block", [lambda: LlamaMLP(16, 40),
                                        lambda: MixtralSparseMoeBlock(16, 24, 4, 2)],
                         ids=["llama_mlp", "mixtral_moe"])
def test_training_matches_pytorch_blocks(make_block):
    torch.manual_seed(3)
    reference = TinyLM(make_block)
    swapped = swap_blocks(reference)
    ref_losses = train(reference, 5)
    losses = train(swapped, 5)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4, atol=1e-5)
    # The weights after five SGD steps, block by block, name by name.
    for ref_block, block in zip(reference.blocks, swapped.blocks):
        state = ref_block.state_dict()
        for name, p in block.named_ffn_parameters():
            np.testing.assert_allclose(p.detach().numpy(), state[name].numpy(), rtol=1e-3,
                                       atol=1e-5, err_msg=name)


def test_parameters_share_memory_with_the_layer():
    block = ft.FFN(variant="swiglu", d_model=8, d_ff=16, bias=False)
    p = dict(block.named_ffn_parameters())["down_proj.weight"]
    view = block.layer.parameters()["down_proj.weight"]
    assert p.data_ptr() == view.__array_interface__["data"][0]
    with torch.no_grad():
        p.mul_(0.0)
    assert float(np.abs(view).max()) == 0.0


def test_moe_aux_loss_is_differentiable_and_counted_once():
    torch.manual_seed(4)
    config = {"variant": "moe", "d_model": 8, "d_ff": 12, "bias": False,
              "moe": {"num_experts": 4, "top_k": 2, "aux_coef": 0.5, "router_bias": False}}
    x = torch.randn(10, 8)
    block = ft.FFN(config, seed=1)
    y = block(x)
    assert block.aux_loss.requires_grad and block.aux_loss.item() > 0
    # Only the aux loss: its gradient reaches the router alone, and equals ffnlab's own
    # backward with dy = 0 and aux_loss_scale 1 (the numpy API).
    block.aux_loss.backward()
    router = dict(block.named_ffn_parameters())["gate.weight"].grad.clone()
    layer = ffnlab.FFN(config, seed=1)
    layer.forward(x.numpy(), train=True)
    layer.backward(np.zeros((10, 8), dtype=np.float32))
    np.testing.assert_allclose(router.numpy(), layer.grads()["gate.weight"], rtol=1e-5, atol=1e-7)
    assert float(router.abs().max()) > 0
    expert = dict(block.named_ffn_parameters())["experts.0.up_proj.weight"].grad
    assert expert is None or float(expert.abs().max()) == 0.0
    # Without the aux loss in the loss, the router gets no aux gradient.
    block.zero_grad()
    y = block(x)
    y.sum().backward()
    layer.zero_grad()
    layer.set_aux_loss_scale(0.0)
    layer.forward(x.numpy(), train=True)
    layer.backward(np.ones((10, 8), dtype=np.float32))
    got = dict(block.named_ffn_parameters())["gate.weight"].grad.numpy()
    np.testing.assert_allclose(got, layer.grads()["gate.weight"], rtol=1e-4, atol=1e-6)


def test_x_changed_in_place_after_forward_is_refused_as_autograd_refuses_it():
    # The layer reads x's memory again in backward: a change in between would give the
    # gradients of other inputs, silently.
    block = ft.FFN(variant="relu", d_model=8, d_ff=16)
    lin = nn.Linear(8, 8)
    h = lin(torch.randn(4, 8))
    y = block(h)
    h.mul_(0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_a_frozen_parameter_gets_no_grad_and_no_optimizer_moves_it():
    torch.manual_seed(3)
    block = ft.FFN(variant="swiglu", d_model=8, d_ff=16)
    name, frozen = block.named_ffn_parameters()[0]
    frozen.requires_grad_(False)
    before = frozen.detach().clone()
    others = [p.detach().clone() for n, p in block.named_ffn_parameters() if n != name]
    opt = torch.optim.SGD(block.parameters(), lr=1.0)
    block(torch.randn(4, 8)).pow(2).sum().backward()
    opt.step()
    assert frozen.grad is None
    assert torch.equal(frozen.detach(), before)
    # Frozen after training, with its gradient zeroed in place: backward adds nothing to it.
    trained = block.named_ffn_parameters()[1][1]
    trained.requires_grad_(False)
    opt.zero_grad(set_to_none=False)
    kept = trained.detach().clone()
    block(torch.randn(4, 8)).pow(2).sum().backward()
    opt.step()
    assert torch.equal(trained.detach(), kept)
    # The others trained.
    assert any(not torch.equal(p.detach(), b) for (n, p), b in
               zip([q for q in block.named_ffn_parameters() if q[0] != name], others))


def test_what_would_end_the_memory_sharing_is_refused_and_what_keeps_it_works():
    block = ft.FFN(variant="moe", d_model=8, d_ff=16,
                   moe={"num_experts": 4, "top_k": 2, "balance_bias": True})  # a buffer too
    x = torch.randn(5, 8)
    y = block(x)
    model = nn.Sequential(nn.Linear(8, 8), block)  # converted through a module that holds it
    for convert in (lambda m: m.double(), lambda m: m.half(), lambda m: m.to(torch.bfloat16),
                    lambda m: m.share_memory(), lambda m: model.share_memory(),
                    lambda m: model[1:].double()):
        with pytest.raises(RuntimeError, match="ffnlab's own float32 CPU memory"):
            convert(block)
    assert all(not b.is_shared() for b in block.buffers())
    # nothing was converted on the way: the module still computes with its weights
    assert block.float() is block and block.cpu() is block and block.to("cpu") is block
    assert all(p.dtype == torch.float32 for p in block.parameters())
    assert torch.equal(block(x), y)
    # load_state_dict copies into ffnlab's memory; with assign=True it would replace the tensors
    state = {k: v.clone() * 2 for k, v in block.state_dict().items()}
    block.load_state_dict(state)
    assert not torch.equal(block(x), y)
    with pytest.raises(RuntimeError, match="assign=True"):
        block._load_from_state_dict(state, "", {"assign_to_params_buffers": True}, True, [], [],
                                    [])
    # a parameter replaced by hand is found by the next forward (an inference one too), one whose
    # memory was replaced (.data =) by the next training forward
    name = block.named_ffn_parameters()[0][0].replace(".", "_")
    for replace in (lambda p: torch.nn.Parameter(p.detach().clone()),
                    lambda p: setattr(p, "data", p.detach().clone()) or p):
        again = ft.FFN(variant="swiglu", d_model=8, d_ff=16)
        setattr(again, "up_proj_weight", replace(again.up_proj_weight))
        with pytest.raises(RuntimeError, match="'up_proj_weight' was replaced"):
            again(x)
    again = ft.FFN(variant="swiglu", d_model=8, d_ff=16)
    again.up_proj_weight = torch.nn.Parameter(again.up_proj_weight.detach().clone())
    with torch.no_grad(), pytest.raises(RuntimeError, match="'up_proj_weight' was replaced"):
        again(x)
    assert name in dict(block.named_parameters())


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_is_the_same_module_with_memory_of_its_own(how):
    import pickle
    torch.manual_seed(4)
    block = ft.FFN(variant="moe", d_model=8, d_ff=16, seed=5,
                   moe={"num_experts": 4, "top_k": 2, "balance_bias": True, "jitter": 0.1})
    x = torch.randn(6, 8)
    block(x.requires_grad_()).sum().backward()  # gradients in ffnlab's buffer
    block.after_optimizer_step()  # the balancing bias moves: a buffer
    block.named_ffn_parameters()[0][1].requires_grad_(False)  # frozen, its .grad kept
    block.eval()
    twin = copy.deepcopy(block) if how == "deepcopy" else pickle.loads(pickle.dumps(block))
    assert not twin.training and twin.router_logits == block.router_logits
    for (n, p), (m, q) in zip(block.named_parameters(), twin.named_parameters()):
        assert n == m and torch.equal(p, q) and p.data_ptr() != q.data_ptr()
        assert p.requires_grad == q.requires_grad
        assert (p.grad is None) == (q.grad is None)
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad) and p.grad.data_ptr() != q.grad.data_ptr()
    for (n, b), (m, c) in zip(block.named_buffers(), twin.named_buffers()):
        assert n == m and torch.equal(b, c) and b.data_ptr() != c.data_ptr()
    # The same layer: the same output, and in training the same draws of router noise next.
    with torch.no_grad():
        assert torch.equal(block(x), twin(x))
    block.train()
    twin.train()
    assert torch.equal(block(x), twin(x))
    # Independent: training the copy leaves the original as it was.
    before = [p.detach().clone() for p in block.parameters()]
    opt = torch.optim.SGD(twin.parameters(), lr=1.0)
    twin(x).pow(2).sum().backward()
    opt.step()
    assert all(torch.equal(p, b) for p, b in zip(block.parameters(), before))
    assert any(not torch.equal(p, q) for p, q in zip(block.parameters(), twin.parameters()))


def test_a_layers_state_that_does_not_read_is_refused():
    import pickle
    layer = ffnlab.FFN(variant="swiglu", d_model=8, d_ff=16)
    again = pickle.loads(pickle.dumps(layer))
    assert np.array_equal(again.forward(np.ones((2, 8), np.float32)),
                          layer.forward(np.ones((2, 8), np.float32)))
    rebuild, (state,) = layer.__reduce__()
    assert rebuild is ffnlab._ffn_from_state
    for change, message in [(dict(format="ffnlab.FFN 0"), "format 'ffnlab.FFN 0'"),
                            (dict(values=np.zeros(3, np.float32)), "'values' must be"),
                            (dict(names=["x"]), "its parameters are not the config's"),
                            (dict(config=dict(state["config"], kind="plain")),
                             "its parameters are not the config's"),
                            (dict(config=dict(state["config"], d_ff=32)), "'values' must be")]:
        with pytest.raises(ValueError, match="not the state of an ffnlab.FFN.*" + message):
            rebuild(dict(state, **change))
    with pytest.raises(ValueError, match="no 'grads'"):
        rebuild({k: v for k, v in state.items() if k != "grads"})
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):  # every protocol, the oldest included
        for obj in (layer, ft.FFN(layer=layer)):
            again = pickle.loads(pickle.dumps(obj, protocol=protocol))
            assert np.array_equal(
                (again if isinstance(again, ffnlab.FFN) else again.layer).forward(
                    np.ones((2, 8), np.float32)), layer.forward(np.ones((2, 8), np.float32)))


def test_a_stale_backward_is_refused():
    block = ft.FFN(variant="relu", d_model=4, d_ff=8)
    x = torch.randn(3, 4, requires_grad=True)
    first = block(x).sum()
    block(x).sum()  # a second forward replaces the saved activations
    with pytest.raises(RuntimeError, match="not the layer's last"):
        first.backward()


def test_another_threads_forward_cannot_slip_between_a_forward_and_its_number():
    # Thread B's forward starts while thread A's is inside the layer. Had B's forward run
    # before A read the layer's forward number, A's backward would pass its check and take B's
    # activations: B waits for A's forward instead, and A's backward is then stale.
    import threading
    import time
    block = ft.FFN(variant="relu", d_model=4, d_ff=8)

    class Layer:  # the layer, with thread B started inside A's first forward
        def __init__(self, layer):
            self.layer, self.other = layer, None

        def __getattr__(self, name):
            return getattr(self.layer, name)

        def forward(self, *args, **kwargs):
            y = self.layer.forward(*args, **kwargs)
            if self.other is None:
                self.other = threading.Thread(target=lambda: block(torch.randn(3, 4)).sum())
                self.other.start()
                time.sleep(0.3)  # ample for B's forward, unless it waits for this one
            return y

    block.layer = Layer(block.layer)
    first = block(torch.randn(3, 4, requires_grad=True)).sum()
    block.layer.other.join()
    with pytest.raises(RuntimeError, match="not the layer's last"):
        first.backward()


def test_inputs_of_any_leading_shape_and_no_grad():
    block = ft.FFN(variant="gelu", d_model=6, d_ff=12, seed=2)
    x = torch.randn(2, 3, 6)
    y = block(x)
    assert y.shape == x.shape
    with torch.no_grad():
        np.testing.assert_allclose(block(x).numpy(), y.detach().numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="float32"):
        block(x.double())
    with pytest.raises(ValueError, match="features"):
        block(torch.randn(2, 5))


def test_grads_accumulate_in_ffnlab_buffer_and_survive_set_to_none():
    torch.manual_seed(5)
    block = ft.FFN(variant="swiglu", d_model=8, d_ff=16, bias=True, seed=3)
    x = torch.randn(6, 8)
    block(x).sum().backward()
    params = dict(block.named_ffn_parameters())
    once = {n: p.grad.clone() for n, p in params.items()}
    # .grad is ffnlab's buffer: no copy per step.
    grads = block.layer.grads()
    for n, p in params.items():
        assert p.grad.data_ptr() == grads[n].__array_interface__["data"][0], n
    block(x).sum().backward()  # accumulates, as autograd would
    for n, p in params.items():
        torch.testing.assert_close(p.grad, 2 * once[n], rtol=1e-5, atol=1e-6)
    opt = torch.optim.SGD(block.parameters(), lr=0.1)
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in params.values())
    block(x).sum().backward()  # re-attached and zeroed first
    for n, p in params.items():
        torch.testing.assert_close(p.grad, once[n], rtol=1e-5, atol=1e-6)
    opt.zero_grad(set_to_none=False)  # zeroes the buffer in place
    assert float(np.abs(grads["up_proj.weight"]).max()) == 0.0
    # A .grad set by hand: the next backward adds to its value.
    w = params["down_proj.weight"]
    w.grad = torch.ones_like(w)
    block(x).sum().backward()
    torch.testing.assert_close(w.grad, once["down_proj.weight"] + 1, rtol=1e-5, atol=1e-6)


def test_balancing_bias_is_a_buffer_no_optimizer_moves():
    block = ft.FFN(variant="moe", d_model=8, d_ff=12,
                   moe={"num_experts": 4, "top_k": 2, "balance_bias": True})
    names = [n for n, _ in block.named_parameters()]
    assert "gate_e_score_correction_bias" not in names
    assert "gate_e_score_correction_bias" in dict(block.named_buffers())
    assert block.layer.trainable()["gate.e_score_correction_bias"] is False
    bias = block.layer.parameters()["gate.e_score_correction_bias"]
    opt = torch.optim.AdamW(block.parameters(), lr=0.1, weight_decay=0.5)
    x = torch.randn(16, 8)
    block(x).sum().backward()
    opt.step()
    assert float(np.abs(bias).max()) == 0.0  # untouched by the optimizer's step and decay
    block.after_optimizer_step()  # ffnlab's own update rule moves it
    assert float(np.abs(bias).max()) > 0.0


def test_relu_routing_trains_in_a_torch_loop_towards_its_sparsity():
    torch.manual_seed(5)
    block = ft.FFN(variant="moe", d_model=8, d_ff=12, bias=False,
                   moe={"num_experts": 4, "top_k": 1, "routing": "relu", "normalize": False,
                        "l1_coef_init": 0.05})
    assert "gate_l1_coef" in dict(block.named_buffers())
    assert "gate_l1_coef" not in dict(block.named_parameters())
    opt = torch.optim.AdamW(block.parameters(), lr=3e-2)
    x, target = torch.randn(64, 8), torch.randn(64, 8)
    counts = []
    for _ in range(100):
        loss = (block(x) - target).pow(2).mean() + block.aux_loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        block.after_optimizer_step()
        counts.append(block.stats()["experts_per_token"])
    # From about half of the 4 experts open to the target of one (the router's bias lets the
    # gates close on these symmetric inputs; a Transformer's hidden states need none).
    assert counts[0] > 1.5
    assert abs(np.mean(counts[-20:]) - 1.0) < 0.3, counts
    assert block.stats()["l1_coef"] != pytest.approx(0.05)


def test_expert_choice_routes_each_sequence_of_a_batch_on_its_own():
    torch.manual_seed(6)
    block = ft.FFN(variant="moe", d_model=8, d_ff=12,
                   moe={"num_experts": 4, "top_k": 1, "routing": "expert_choice",
                        "normalize": False})
    x = torch.randn(3, 8, 8, requires_grad=True)  # 3 sequences of 8: ceil(8/4) = 2 tokens each
    y = block(x)
    assert block.stats()["tokens_per_expert"] == [6, 6, 6, 6]
    # Each sequence on its own: the first sequence alone routes as it did in the batch.
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    alone = block(x[:1].detach())
    assert torch.allclose(alone, y[:1].detach(), atol=1e-6)


def test_gating_residual_chains_layers_and_carries_the_gradient_back():
    # MoE++: the second layer takes the first's logits; the first layer's router then gets a
    # gradient through them too (compare with the residual cut off by detach()).
    config = {"kind": "moe", "d_model": 16, "d_ff": 24,
              "moe": {"num_experts": 4, "top_k": 2, "zero_experts": 1, "gating_residual": True}}
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(7))

    def router_grad(cut):
        first, second = ft.FFN(config, seed=1), ft.FFN(config, seed=2)
        y1, logits1 = first(x, first=True)
        assert logits1.shape == (2, 6, 5)
        y2, _ = second(y1, gate_residual=logits1.detach() if cut else logits1)
        y2.square().sum().backward()
        return first.gate_weight.grad.clone()

    joined, cut = router_grad(False), router_grad(True)
    assert not torch.allclose(joined, cut)
    plain = ft.FFN(variant="moe", d_model=16, d_ff=24)
    with pytest.raises(ValueError, match="no gating_residual"):
        plain(x, gate_residual=torch.zeros(2, 6, 8))


def test_every_library_activation_has_a_torch_name():
    # A block using any activation ffnlab has can be taken over: each is the target of a torch
    # or Hugging Face class name (a new activation fails here until it is mapped).
    assert set(ft._ACTIVATIONS.values()) == set(ffnlab._ffnlab.activation_names())
    assert ft._act_name(nn.Identity()) == "identity"
    assert ft._act_name(nn.SiLU()) == "silu"


def test_a_wrapped_layer_takes_no_config_besides():
    layer = ffnlab.FFN(d_model=8, d_ff=16)
    assert ft.FFN(layer=layer).layer is layer
    with pytest.raises(ValueError, match="layer= wraps a built layer"):
        ft.FFN(layer=layer, d_model=16)  # would have been ignored


def test_eval_mode_routes_as_at_inference_with_gradients_too():
    # Training-only routing (gate noise, router jitter) follows module.training, as PyTorch's
    # own modules do; whether the layer keeps activations follows autograd alone.
    block = ft.FFN(variant="moe", d_model=8, d_ff=16, seed=4,
                   moe={"num_experts": 4, "top_k": 2, "noisy_topk": True, "jitter": 0.3})
    x = torch.randn(12, 8)
    with torch.no_grad():
        inference = block(x).numpy()
    block.eval()
    xg = x.clone().requires_grad_(True)
    evaluated = block(xg)
    np.testing.assert_allclose(evaluated.detach().numpy(), inference, rtol=1e-5, atol=1e-6)
    evaluated.sum().backward()  # the gradient of the forward as it routed
    assert xg.grad is not None and torch.isfinite(xg.grad).all()
    noise = dict(block.named_ffn_parameters())["gate.noise.weight"]
    assert noise.grad is not None and not noise.grad.any()  # no noise, so no gradient for it
    block.train()
    trained = block(x.clone().requires_grad_(True))
    assert not np.allclose(trained.detach().numpy(), inference, atol=1e-4)
    # The layer itself: stochastic routing needs a training forward.
    with pytest.raises(ValueError, match="stochastic=True routes as in training"):
        block.layer.forward(x.numpy(), stochastic=True)


def test_a_block_that_returns_its_router_logits_is_replaced_by_one_that_does():
    # Hugging Face's Mixtral block returns (hidden, router_logits [tokens, E]), and its decoder
    # adds a balancing loss over the logits: the copy returns both, and that loss's gradient
    # reaches the router and x as PyTorch's does.
    torch.manual_seed(5)
    block = MixtralSparseMoeBlock(16, 24, 4, 2, returns_logits=True)
    swapped = ft.from_module(block)
    assert swapped.router_logits
    x = torch.randn(2, 5, 16)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ya, la = block(xa)
    yb, lb = swapped(xb)
    assert la.shape == lb.shape == (10, 4)
    np.testing.assert_allclose(yb.detach().numpy(), ya.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lb.detach().numpy(), la.detach().numpy(), rtol=1e-5, atol=1e-6)

    def loss(y, logits):
        return (y ** 2).sum() + 3.0 * torch.softmax(logits, dim=-1).square().sum()

    loss(ya, la).backward()
    loss(yb, lb).backward()
    np.testing.assert_allclose(xb.grad.numpy(), xa.grad.numpy(), rtol=1e-4, atol=1e-5)
    gate = dict(swapped.named_ffn_parameters())["gate.weight"]
    np.testing.assert_allclose(gate.grad.numpy(), block.gate.weight.grad.numpy(), rtol=1e-4,
                               atol=1e-5)
    # The probe of the block's outputs leaves torch's random numbers where they were.
    torch.manual_seed(9)
    expected = torch.rand(3)
    torch.manual_seed(9)
    ft.from_module(block)
    assert torch.equal(torch.rand(3), expected)
    # A block that returns the hidden states alone gives a module that does too.
    plain = ft.from_module(MixtralSparseMoeBlock(16, 24, 4, 2))
    assert not plain.router_logits and isinstance(plain(x), torch.Tensor)
    with pytest.raises(ValueError, match="router_logits=True returns an MoE router's logits"):
        ft.FFN(variant="relu", d_model=8, d_ff=16, router_logits=True)
    block.jitter_noise = 0.1  # Hugging Face's, on the experts' input too: not copied, said
    with pytest.warns(UserWarning, match="jitter_noise = 0.1 is not copied"):
        ft.from_module(block)
