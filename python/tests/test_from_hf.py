"""ffnlab.from_hf: a Hugging Face config.json and a safetensors file (written here the way the
format defines it: an 8-byte little-endian header length, a JSON header, the raw data) give the
layer the PyTorch block computes."""
import json
import struct

import numpy as np
import pytest
import torch

import ffnlab
from ffnlab.hf_blocks import LlamaMLP, MixtralSparseMoeBlock


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        data = t.detach().contiguous().float().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


@pytest.mark.parametrize("model", ["llama", "mixtral"])
def test_from_hf_matches_the_block(tmp_path, model):
    torch.manual_seed(6)
    if model == "llama":
        block = LlamaMLP(16, 40)
        config = {"model_type": "llama", "hidden_size": 16, "intermediate_size": 40,
                  "hidden_act": "silu"}
        prefix = "model.layers.3.mlp."
    else:
        block = MixtralSparseMoeBlock(16, 24, experts=4, top_k=2)
        config = {"model_type": "mixtral", "hidden_size": 16, "intermediate_size": 24,
                  "num_local_experts": 4, "num_experts_per_tok": 2, "hidden_act": "silu"}
        prefix = "model.layers.3.block_sparse_moe."
    (tmp_path / "config.json").write_text(json.dumps(config))
    # Another layer's tensors beside it, as in a real checkpoint: only the prefix's are read.
    tensors = {prefix + k: v for k, v in block.state_dict().items()}
    tensors["model.layers.2.other.weight"] = torch.zeros(3, 3)
    write_safetensors(tmp_path / "model.safetensors", tensors)

    layer = ffnlab.from_hf(str(tmp_path / "config.json"), str(tmp_path / "model.safetensors"),
                           prefix)
    x = torch.randn(9, 16)
    with torch.no_grad():
        expect = block(x).numpy()
    np.testing.assert_allclose(layer.forward(x.numpy()), expect, rtol=1e-5, atol=1e-5)

    # A tensor under the prefix that the config's layer has no parameter for (a bias) is refused:
    # the layer would compute without it.
    tensors[prefix + "gate.bias" if model == "mixtral" else prefix + "up_proj.bias"] = \
        torch.zeros(4 if model == "mixtral" else 40)
    write_safetensors(tmp_path / "biased.safetensors", tensors)
    with pytest.raises(ValueError, match="no parameter of this layer"):
        ffnlab.from_hf(str(tmp_path / "config.json"), str(tmp_path / "biased.safetensors"), prefix)

    with pytest.raises(ValueError, match="model.layers.4.mlp."):
        ffnlab.from_hf(str(tmp_path / "config.json"), str(tmp_path / "model.safetensors"),
                       "model.layers.4.mlp.")


def test_from_hf_seed_sets_each_layers_noise(tmp_path):
    """seed draws the routing noise of stochastic forwards (and initialises the weights when no
    file is given): layers loaded with one seed route alike, with two seeds apart."""
    config = tmp_path / "ffn.json"
    config.write_text(json.dumps({"variant": "moe", "d_model": 8, "d_ff": 16,
                                  "moe": {"num_experts": 4, "top_k": 1, "jitter": 0.5}}))
    x = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)

    def routed(seed):
        layer = ffnlab.from_hf(str(config), seed=seed)
        # (the weights of seed 3, so that only the noise differs between layers)
        for name, value in ffnlab.from_hf(str(config), seed=3).parameters().items():
            layer.parameters()[name][...] = value
        return layer.forward(x, train=True)  # (jitter scales the router's input: the mix moves)

    np.testing.assert_array_equal(routed(1), routed(1))
    assert not np.array_equal(routed(1), routed(2))
    a, b = ffnlab.from_hf(str(config), seed=1), ffnlab.from_hf(str(config), seed=2)
    assert not np.array_equal(a.parameters()["gate.weight"], b.parameters()["gate.weight"])
    with pytest.raises(ValueError, match="from_hf: seed"):
        ffnlab.from_hf(str(config), seed=-1)
