"""ffnlab's layers on numpy arrays against the same blocks in PyTorch: outputs, dx and every
parameter gradient (the numpy API, without ffnlab.torch)."""
import json
import pathlib
import subprocess

import numpy as np
import pytest
import torch

import ffnlab
from ffnlab.hf_blocks import LlamaMLP, MixtralSparseMoeBlock


def load_into(layer, block):
    """Copies a PyTorch block's weights into an ffnlab layer, by Hugging Face name."""
    state = block.state_dict()
    params = layer.parameters()
    assert set(params) == set(state), (sorted(params), sorted(state))
    for name, view in params.items():
        view[...] = state[name].detach().numpy()


def compare(layer, block, tokens, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, layer.d_model), dtype=np.float32)
    dy = rng.standard_normal((tokens, layer.d_model), dtype=np.float32)
    load_into(layer, block)

    xt = torch.from_numpy(x.copy()).requires_grad_(True)
    yt = block(xt)
    yt.backward(torch.from_numpy(dy))

    layer.zero_grad()
    y = layer.forward(x, train=True)
    dx = layer.backward(dy)
    scale = lambda a: max(1.0, float(np.abs(a).max()))
    np.testing.assert_allclose(y, yt.detach().numpy(), atol=2e-5 * scale(y), rtol=0)
    np.testing.assert_allclose(dx, xt.grad.numpy(), atol=2e-5 * scale(dx), rtol=0)
    grads = layer.grads()
    for name, p in block.named_parameters():
        # PyTorch leaves .grad None for an expert that got no token; ffnlab's is zero.
        expect = p.grad.numpy() if p.grad is not None else np.zeros(tuple(p.shape), np.float32)
        np.testing.assert_allclose(grads[name], expect, atol=2e-5 * scale(expect), rtol=0,
                                   err_msg=name)
    # Inference gives the training forward's output.
    np.testing.assert_allclose(layer.forward(x), y, atol=1e-5 * scale(y), rtol=0)


@pytest.mark.parametrize("tokens", [1, 8, 67])
def test_swiglu_matches_llama_mlp(tokens):
    torch.manual_seed(1)
    block = LlamaMLP(32, 88)
    layer = ffnlab.FFN(variant="swiglu", d_model=32, d_ff=88, bias=False)
    compare(layer, block, tokens, seed=tokens)


@pytest.mark.parametrize("tokens", [3, 64])
def test_moe_matches_mixtral_block(tokens):
    torch.manual_seed(2)
    block = MixtralSparseMoeBlock(24, 40, experts=4, top_k=2)
    layer = ffnlab.FFN({"kind": "moe", "activation": "silu", "d_model": 24, "d_ff": 40,
                        "bias": False,
                        "moe": {"num_experts": 4, "top_k": 2, "expert_kind": "glu",
                                "router_bias": False, "naming": "mixtral"}})
    compare(layer, block, tokens, seed=10 + tokens)
    stats = layer.stats()
    assert sum(stats["tokens_per_expert"]) == 2 * tokens
    assert stats["num_experts"] == 4


def test_top_p_routing_takes_fewer_experts_and_reports_how_many():
    layer = ffnlab.FFN({"kind": "moe", "d_model": 16, "d_ff": 24,
                        "moe": {"num_experts": 6, "top_k": 4, "routing": "top_p", "top_p": 0.5,
                                "normalize": False, "entropy_coef": 1e-4}}, seed=3)
    assert layer.config["moe"]["routing"] == "top_p"
    gate = layer.parameters()["gate.weight"]
    gate *= 8.0  # a sharp router: tokens stop at different counts
    x = np.random.default_rng(1).standard_normal((40, 16), dtype=np.float32)
    layer.forward(x)
    stats = layer.stats()
    by_count = stats["tokens_by_experts"]
    assert len(by_count) == 5 and sum(by_count) == 40 and by_count[0] == 0
    assert by_count[4] < 40  # some tokens reached the mass before the cap
    mean = sum(n * c for n, c in enumerate(by_count)) / 40
    assert stats["experts_per_token"] == pytest.approx(mean)
    assert sum(stats["tokens_per_expert"]) == sum(n * c for n, c in enumerate(by_count))


def test_relu_routing_takes_the_positive_logits_and_adapts_its_penalty():
    layer = ffnlab.FFN({"kind": "moe", "d_model": 16, "d_ff": 24,
                        "moe": {"num_experts": 6, "top_k": 2, "routing": "relu",
                                "normalize": False, "router_bias": False,
                                "l1_coef_init": 0.01}}, seed=3)
    assert layer.trainable()["gate.l1_coef"] is False
    x = np.random.default_rng(1).standard_normal((40, 16), dtype=np.float32)
    layer.forward(x, train=True)
    stats = layer.stats()
    logits = x @ layer.parameters()["gate.weight"].T
    open_gates = (logits > 0).sum(1)
    assert stats["tokens_by_experts"] == list(np.bincount(open_gates, minlength=7))
    assert stats["tokens_per_expert"] == list((logits > 0).sum(0))
    assert stats["experts_per_token"] == pytest.approx(open_gates.mean())
    # The L1 penalty: E/(k·T²)·Σ_e n_e·Σ_t gate_te, times its coefficient.
    gates = np.maximum(logits, 0)
    l1 = 6 / (2 * 40 * 40) * ((logits > 0).sum(0) * gates.sum(0)).sum()
    assert layer.aux_loss == pytest.approx(0.01 * l1, rel=1e-5)
    # About half the gates open at initialisation, less sparse than 1 - 2/6 asks: the coefficient
    # grows by 1.2 at the optimizer step.
    assert open_gates.mean() > 2
    layer.after_optimizer_step()
    assert layer.stats()["l1_coef"] == pytest.approx(0.012)


def test_zero_computation_experts_run_no_rows_and_train():
    layer = ffnlab.FFN({"kind": "moe", "d_model": 16, "d_ff": 24,
                        "moe": {"num_experts": 4, "top_k": 2, "constant_experts": 2,
                                "copy_experts": 1, "zero_experts": 1}}, seed=3)
    params = layer.parameters()
    assert params["gate.weight"].shape == (8, 16)  # 4 FFN + 4 zero-computation experts
    assert params["constant_experts.1.gate.weight"].shape == (2, 16)
    x = np.random.default_rng(2).standard_normal((64, 16), dtype=np.float32)
    layer.forward(x, train=True)
    stats = layer.stats()
    assert len(stats["tokens_per_expert"]) == 4
    assert 0 < stats["zero_computation_fraction"] < 1
    # Every choice is an FFN expert's row or a zero-computation one.
    ffn = sum(stats["tokens_per_expert"])
    assert ffn == pytest.approx(64 * 2 * (1 - stats["zero_computation_fraction"]))
    assert stats["experts_per_token"] == pytest.approx(ffn / 64)
    layer.backward(np.ones_like(x))
    grads = layer.grads()
    assert np.abs(grads["constant_experts.0.vector"]).max() > 0
    assert np.abs(grads["constant_experts.0.gate.weight"]).max() > 0


def test_gating_residual_adds_the_previous_logits_and_returns_their_gradient():
    # MoE++: logits = x·W_rᵀ + b + G·W_gᵀ. With dy = 0 and no auxiliary loss, the logits'
    # gradient is the dlogits handed in, so every gradient has a closed form.
    layer = ffnlab.FFN({"kind": "moe", "d_model": 16, "d_ff": 24,
                        "moe": {"num_experts": 4, "top_k": 2, "copy_experts": 1,
                                "gating_residual": True}}, seed=4)
    p = layer.parameters()
    assert p["gate.gate_map.weight"].shape == (5, 5)  # 4 FFN experts + 1 copy expert
    rng = np.random.default_rng(5)
    x = rng.standard_normal((12, 16), dtype=np.float32)
    res = rng.standard_normal((12, 5), dtype=np.float32)
    dlogits = rng.standard_normal((12, 5), dtype=np.float32)
    layer.forward(x, train=True, gate_residual=res)
    want = x @ p["gate.weight"].T + p["gate.bias"] + res @ p["gate.gate_map.weight"].T
    np.testing.assert_allclose(layer.logits, want, rtol=1e-5, atol=1e-5)
    layer.zero_grad()
    layer.backward(np.zeros_like(x), dlogits=dlogits)
    g = layer.grads()
    np.testing.assert_allclose(layer.gate_residual_grad, dlogits @ p["gate.gate_map.weight"],
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g["gate.gate_map.weight"], dlogits.T @ res, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g["gate.weight"], dlogits.T @ x, rtol=1e-5, atol=1e-5)
    # A first layer has no residual, and says so: no gradient for one. Another refuses.
    layer.forward(x, train=True, first=True)
    layer.backward(np.zeros_like(x))
    assert layer.gate_residual_grad.shape == (0, 0)
    with pytest.raises(Exception, match="no gate residual .* was given"):
        layer.forward(x)
    with pytest.raises(ValueError, match="gate_residual has 3 rows, x 12"):
        layer.forward(x, gate_residual=res[:3])
    plain = ffnlab.FFN(variant="moe", d_model=16, d_ff=24)
    with pytest.raises(ValueError, match="no gating_residual"):
        plain.forward(x, gate_residual=res)
    # first=True means something only to a gating residual, and never beside one.
    with pytest.raises(ValueError, match="first=True: the layer has no gating_residual"):
        plain.forward(x, first=True)
    with pytest.raises(ValueError, match="first=True: a model's first MoE layer takes no "
                                         "gate_residual"):
        layer.forward(x, gate_residual=res, first=True)


def test_token_ids_are_one_per_row_and_not_negative():
    # The tokens' ids, which routings that choose by id read; the others refuse them, as a layer
    # without MoE++'s gating residual refuses gate_residual.
    layer = ffnlab.FFN({"variant": "moe", "d_model": 16, "d_ff": 24,
                        "moe": {"routing": "hash", "top_k": 1}})
    x = np.ones((4, 16), dtype=np.float32)
    layer.forward(x, token_ids=np.arange(4))
    with pytest.raises(ValueError, match=r"token_ids must be \[T\] = \[4\]"):
        layer.forward(x, token_ids=np.arange(3))
    with pytest.raises(ValueError, match="token id -1 is outside"):
        layer.forward(x, token_ids=np.array([0, 1, 2, -1]))
    for unread in (ffnlab.FFN(variant="moe", d_model=16, d_ff=24), ffnlab.FFN(d_model=16)):
        with pytest.raises(ValueError, match="token_ids given, but the layer's routing does not "
                                             "read them"):
            unread.forward(x, token_ids=np.arange(4))


def test_hash_routing_chooses_by_the_token_ids_it_is_given():
    # Roller et al.'s hash layer: no router parameters; a row's expert depends on its id only.
    layer = ffnlab.FFN({"kind": "moe", "d_model": 8, "d_ff": 16,
                        "moe": {"num_experts": 4, "top_k": 1, "routing": "hash"}}, seed=3)
    assert not any(n.startswith("gate.") for n in layer.parameters())
    x = np.tile(np.random.default_rng(4).standard_normal((1, 8), dtype=np.float32), (256, 1))
    y = layer.forward(x, token_ids=np.arange(256))
    same = layer.forward(x, token_ids=np.arange(256))
    np.testing.assert_array_equal(y, same)
    # One input row, 256 ids: as many outputs as experts the ids reach (all 4), up to the
    # rounding of a row's place in its expert's block.
    assert len({tuple(np.round(row, 4)) for row in y}) == 4
    with pytest.raises(ValueError, match=r"the layer's routing \(hash\) chooses experts by the "
                                         r"tokens' ids: give token_ids"):
        layer.forward(x)


def test_parameters_are_views_that_keep_the_layer_alive():
    layer = ffnlab.FFN(variant="relu", d_model=4, d_ff=8)
    w = layer.parameters()["down_proj.weight"]
    assert w.shape == (4, 8) and w.dtype == np.float32
    x = np.ones((2, 4), dtype=np.float32)
    before = layer.forward(x)
    w[...] = 0.0  # writing the view changes the layer
    np.testing.assert_allclose(layer.forward(x), np.broadcast_to(
        layer.parameters()["down_proj.bias"], (2, 4)))
    assert not np.allclose(before, layer.forward(x))
    del layer  # the view still owns a reference
    w[...] = 1.0
    assert float(w.sum()) == 32.0


def test_gradients_accumulate_until_zero_grad():
    layer = ffnlab.FFN(variant="gelu", d_model=6, d_ff=10, seed=3)
    x = np.random.default_rng(0).standard_normal((5, 6), dtype=np.float32)
    dy = np.ones_like(x)
    layer.forward(x, train=True)
    layer.backward(dy)
    once = {k: v.copy() for k, v in layer.grads().items()}
    layer.forward(x, train=True)
    layer.backward(dy)
    for k, v in layer.grads().items():
        np.testing.assert_allclose(v, 2 * once[k], rtol=1e-6, atol=1e-6)
    layer.zero_grad()
    assert all(float(np.abs(v).max()) == 0.0 for v in layer.grads().values())


def test_params_and_config():
    cost = ffnlab.params(variant="swiglu", d_model=4096, d_ff=14336, bias=False)
    assert cost["params"] == 3 * 4096 * 14336
    assert cost["flops_per_token"]["forward_matmul"] == 2 * 3 * 4096 * 14336
    moe = ffnlab.params({"variant": "moe", "d_model": 64, "d_ff": 128, "bias": False,
                         "moe": {"num_experts": 8, "top_k": 2, "router_bias": False}})
    assert moe["params"] == 8 * 64 + 8 * 2 * 64 * 128
    assert moe["active_params"] == 8 * 64 + 2 * 2 * 64 * 128
    full = ffnlab.config(variant="geglu", d_model=16)
    assert full["activation"] == "gelu" and full["kind"] == "glu" and full["d_model"] == 16
    layer = ffnlab.FFN(full)
    assert layer.config == full
    assert repr(layer) == f"<ffnlab.FFN geglu d_model=16 d_ff={full['d_ff']} params={layer.num_params}>"
    assert layer.num_params == sum(v.size for v in layer.parameters().values())



def test_a_config_that_changes_the_routing_takes_the_new_routings_defaults():
    # BASE layers' defaults (top-1, sigmoid, no router bias) do not follow a config to top-k
    # routing; a value the config changed from them stays, and keys given with the change win.
    keys = ["top_k", "score", "normalize", "router_bias", "aux_coef"]
    topk = ffnlab.config(variant="moe")["moe"]
    base = ffnlab.config(variant="moe", moe={"routing": "base"})
    assert [base["moe"][k] for k in keys] == [1, "sigmoid", False, False, 0.0]
    back = ffnlab.config(base, moe={"routing": "topk"})["moe"]
    assert {k: back[k] for k in keys} == {k: topk[k] for k in keys}
    changed = ffnlab.config(variant="moe", moe={"routing": "base", "router_bias": True})
    kept = ffnlab.config(changed, moe={"routing": "expert_choice", "top_k": 3})["moe"]
    assert kept["router_bias"] is True and kept["top_k"] == 3
    assert kept["score"] == topk["score"] and kept["normalize"] is False  # expert choice's

def test_zoo_is_the_commands_table_and_its_configs_build_layers():
    program = pathlib.Path(ffnlab.__file__).resolve().parents[2] / "ffnlab"
    command = subprocess.run([str(program), "zoo", "--json"], check=True, capture_output=True,
                             text=True).stdout
    zoo = ffnlab.zoo()
    assert zoo == json.loads(command)
    assert {"BERT-base", "LLaMA-2 7B", "Mixtral 8x7B", "DeepSeek-V3"} <= {m["model"] for m in zoo}
    for m in zoo:  # each config costs what the table says, per layer and in all layers
        cost = ffnlab.params(m["config"])
        assert (cost["params"], cost["active_params"]) == (
            m["params_per_layer"], m["active_params_per_layer"]), m["model"]
        assert m["ffn_params_all_layers"] == m["ffn_layers"] * m["params_per_layer"], m["model"]
        assert m["source"], m["model"]
    bert = next(m for m in zoo if m["model"] == "BERT-base")
    layer = ffnlab.FFN(bert["config"])
    assert layer.num_params == bert["params_per_layer"] == 2 * 768 * 3072 + 3072 + 768


def test_precision_threads_and_inference_weights():
    layer = ffnlab.FFN(variant="swiglu", d_model=16, d_ff=32, seed=5)
    x = np.random.default_rng(1).standard_normal((9, 16), dtype=np.float32)
    y = layer.forward(x)
    layer.precision = "bf16"
    assert layer.precision == "bf16"
    y16 = layer.forward(x)
    assert 0 < float(np.abs(y16 - y).max()) < 0.05 * float(np.abs(y).max())
    layer.precision = "f32"
    layer.inference_weights = "bf16"
    assert layer.inference_weights == "bf16"
    assert float(np.abs(layer.forward(x) - y).max()) < 0.05 * float(np.abs(y).max())
    threads = ffnlab.get_threads()
    ffnlab.set_threads(1)
    assert ffnlab.get_threads() == 1
    layer.inference_weights = "f32"
    np.testing.assert_allclose(layer.forward(x), y, rtol=1e-5, atol=1e-6)
    ffnlab.set_threads(threads)


@pytest.fixture
def one_ffnlab_thread():
    """ffnlab on one thread (a core left for the test's own Python thread), restored after."""
    threads = ffnlab.get_threads()
    ffnlab.set_threads(1)
    yield
    ffnlab.set_threads(threads)


def test_a_thread_waiting_for_the_layer_leaves_the_gil_to_others(one_ffnlab_thread):
    # Thread A's long forward holds the layer; thread B asks for its forward count, which waits
    # for A. This thread must run while B waits: it could not if B waited holding the GIL.
    import threading
    import time
    layer = ffnlab.FFN(variant="relu", d_model=256, d_ff=1024)
    x = np.ones((16384, 256), dtype=np.float32)
    for attempt in range(5):
        in_forward = threading.Event()
        span = []

        def work():
            in_forward.set()
            layer.forward(x)

        def wait():
            t0 = time.perf_counter()
            layer.forward_count
            span.extend([t0, time.perf_counter()])

        a = threading.Thread(target=work)
        a.start()
        in_forward.wait()
        time.sleep(0.005)  # A is in the layer by now
        b = threading.Thread(target=wait)
        stamps = []
        b.start()
        while b.is_alive():
            stamps.append(time.perf_counter())
        b.join()
        a.join()
        t0, t1 = span
        if t1 - t0 > 0.02:  # B did wait for A: long enough to tell
            middle = [t for t in stamps if t0 + 0.25 * (t1 - t0) < t < t1 - 0.25 * (t1 - t0)]
            assert len(middle) > 100, (t1 - t0, len(middle))
            break
    else:
        pytest.fail("thread B never waited for A's forward in 5 attempts")


def test_the_gil_is_released_during_forward(one_ffnlab_thread):
    # One ffnlab thread, so that a core is left for this Python thread. While the worker's
    # forward runs in C++, this thread must run too: it could not if the forward held the GIL.
    import threading
    import time
    layer = ffnlab.FFN(variant="relu", d_model=256, d_ff=1024)
    x = np.ones((4096, 256), dtype=np.float32)
    span = []

    def work():
        t0 = time.perf_counter()
        layer.forward(x)
        span.extend([t0, time.perf_counter()])

    worker = threading.Thread(target=work)
    stamps = []
    worker.start()
    while worker.is_alive():
        stamps.append(time.perf_counter())
    worker.join()
    t0, t1 = span
    assert t1 - t0 > 0.01  # long enough to tell
    middle = [t for t in stamps if t0 + 0.25 * (t1 - t0) < t < t1 - 0.25 * (t1 - t0)]
    assert len(middle) > 100


def test_expert_choice_lets_each_expert_take_its_best_tokens_of_a_sequence():
    layer = ffnlab.FFN({"kind": "moe", "d_model": 16, "d_ff": 24,
                        "moe": {"num_experts": 4, "top_k": 2, "routing": "expert_choice",
                                "normalize": False}}, seed=3)
    x = np.random.default_rng(4).standard_normal((24, 16), dtype=np.float32)
    layer.forward(x, train=True, sequence=8)  # three sequences of 8
    stats = layer.stats()
    # ceil(2·8/4) = 4 tokens per expert and sequence: 12 each, 2 experts a token on average,
    # but not 2 for every token.
    assert stats["tokens_per_expert"] == [12, 12, 12, 12]
    assert stats["experts_per_token"] == pytest.approx(2.0)
    assert stats["dropped"] == 0 and stats["load_cv"] == 0
    assert stats["tokens_by_experts"][2] < 24
    logits = x @ layer.parameters()["gate.weight"].T + layer.parameters()["gate.bias"]
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    counts = np.zeros(24, dtype=int)
    for b in range(0, 24, 8):
        for e in range(4):
            counts[b + np.argsort(-probs[b:b + 8, e], kind="stable")[:4]] += 1
    assert stats["tokens_by_experts"] == list(np.bincount(counts, minlength=5))
    layer.backward(np.ones_like(x))
    with pytest.raises(ValueError, match="one token at a time"):
        layer.forward(x[:1])


def test_soft_moe_mixes_every_token_into_every_slot():
    layer = ffnlab.FFN({"kind": "moe", "d_model": 16, "d_ff": 24,
                        "moe": {"num_experts": 4, "routing": "soft", "slots": 2}},
                       seed=3)
    params = layer.parameters()
    assert params["gate.phi"].shape == (8, 16) and params["gate.scale"].tolist() == [1.0]
    assert "gate.weight" not in params
    x = np.random.default_rng(5).standard_normal((24, 16), dtype=np.float32)
    y = layer.forward(x, train=True, sequence=8)
    # Each sequence on its own: the second sequence alone gives the same output.
    second = ffnlab.FFN(layer.config, seed=3)
    assert np.allclose(second.forward(x[8:16]), y[8:16], atol=1e-5)
    stats = layer.stats()
    assert stats["tokens_per_expert"] == [6, 6, 6, 6]  # 2 slots of 3 sequences
    assert stats["experts_per_token"] == pytest.approx(8 / 8)  # E·p/S
    assert stats["dropped"] == 0
    layer.backward(np.ones_like(x))
    assert np.abs(layer.grads()["gate.phi"]).max() > 0
    assert layer.grads()["gate.scale"][0] != 0


def _train_alike_at_each(set_value, get_value, variant, seed, value=16, unit="rows",
                         exact=False):
    # A training layer's output, input gradient and weight gradients with a setting at 0 (never)
    # and at `value`: the same values up to the order of the sums (exact: to the bit).
    saved = get_value()
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((40, 16)).astype(np.float32)
    dy = rng.standard_normal((40, 16)).astype(np.float32)
    results = []
    try:
        for v in (0, value):
            set_value(v)
            assert get_value() == v
            layer = ffnlab.FFN(variant=variant, d_model=16, d_ff=24, seed=3)
            y = layer.forward(x, train=True)
            dx = layer.backward(dy)
            results.append((y, dx, layer.grads()))
    finally:
        set_value(saved)
    (y0, dx0, g0), (y1, dx1, g1) = results
    pairs = [(y1, y0, "y"), (dx1, dx0, "dx")] + [(g1[name], g0[name], name) for name in g0]
    for got, want, name in pairs:
        if exact:
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()),
                                       err_msg=name)
    with pytest.raises(ValueError, match=f"{unit} must be 0"):
        set_value(-1)


def test_packed_weights_train_like_plain_ones():
    # From get_weight_packing_min_rows() rows a training layer reads its weights packed in
    # oneDNN's layout.
    _train_alike_at_each(ffnlab.set_weight_packing_min_rows, ffnlab.get_weight_packing_min_rows,
                         "swiglu", 7)


def test_products_as_a_convolution_train_like_matmuls():
    # From get_conv_min_rows() rows the forward and input-gradient products run as oneDNN's 1x1
    # convolution instead of its matmul.
    _train_alike_at_each(ffnlab.set_conv_min_rows, ffnlab.get_conv_min_rows, "gelu", 8)


def test_layers_in_huge_pages_train_exactly_as_in_small_ones():
    # From get_huge_page_min_bytes() bytes a tensor takes a mapping advised for huge pages:
    # where its memory lies changes no value.
    _train_alike_at_each(ffnlab.set_huge_page_min_bytes, ffnlab.get_huge_page_min_bytes,
                         "swiglu", 9, unit="bytes", exact=True)


def test_each_stochastic_forward_draws_new_noise_from_the_layers_seed():
    # Router jitter and gate noise: a new draw every training forward (the same draw each time
    # would be a constant offset, not noise), the n-th from (seed, n), so a layer built with the
    # same seed repeats the sequence and another seed does not.
    keys = dict(variant="moe", d_model=8, d_ff=16,
                moe={"num_experts": 4, "top_k": 2, "noisy_topk": True, "jitter": 0.3})
    x = np.random.default_rng(3).standard_normal((24, 8)).astype(np.float32)
    a, b, c = ffnlab.FFN(seed=5, **keys), ffnlab.FFN(seed=5, **keys), ffnlab.FFN(seed=6, **keys)
    c_params = c.parameters()
    for name, value in a.parameters().items():  # c: a's weights, another seed
        c_params[name][...] = value
    first, second = a.forward(x, train=True), a.forward(x, train=True)
    assert not np.allclose(first, second, atol=1e-4)
    np.testing.assert_array_equal(b.forward(x, train=True), first)
    np.testing.assert_array_equal(b.forward(x, train=True), second)
    assert not np.allclose(c.forward(x, train=True), first, atol=1e-4)
    # Evaluation forwards draw nothing: the sequence goes on where it was.
    inference = a.forward(x)
    np.testing.assert_array_equal(a.forward(x, train=True, stochastic=False), inference)
    third = a.forward(x, train=True)
    assert not np.allclose(third, inference, atol=1e-4)
    np.testing.assert_array_equal(b.forward(x, train=True), third)


def test_a_printed_config_changed_in_one_key_reads_back():
    # Keys printed only where they mean something: a printed MoE config with another expert
    # width, or with its balancing bias turned off, holds no key the layer would refuse.
    moe = ffnlab.config(variant="moe", d_model=16)
    assert "shared_d_ff" not in moe["moe"] and "balance_rate" not in moe["moe"]
    narrower = ffnlab.config(moe, moe={"expert_d_ff": 8})
    assert narrower["moe"]["expert_d_ff"] == 8
    biased = ffnlab.config(moe, moe={"balance_bias": True, "balance_rate": 0.01})
    assert biased["moe"]["balance_rate"] == pytest.approx(0.01)
    plain = ffnlab.config(ffnlab.config(moe, moe={"balance_bias": True}), moe={"balance_bias": False})
    assert "balance_rate" not in plain["moe"]
    shared = ffnlab.config(moe, moe={"num_shared": 1, "shared_d_ff": 12})
    assert shared["moe"]["shared_d_ff"] == 12
    ffnlab.FFN(ffnlab.config(shared, moe={"expert_d_ff": 8}))  # the shared width stays its own
