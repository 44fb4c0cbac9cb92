"""Bad configs, shapes, dtypes and layouts arrive as Python exceptions with ffnlab's one-line
message; nothing out of bounds is read."""

import math

import numpy as np
import pytest

import ffnlab


def layer():
    return ffnlab.FFN(variant="relu", d_model=8, d_ff=16)


def test_bad_configs_are_value_errors():
    with pytest.raises(ValueError, match=r"\[moe\].*top_k"):
        ffnlab.FFN(variant="moe", d_model=8, moe={"num_experts": 2, "top_k": 3})
    with pytest.raises(ValueError, match="unknown activation 'selu'"):
        ffnlab.FFN(variant="relu", activation="selu")
    with pytest.raises(ValueError, match="d_modle"):
        ffnlab.FFN(variant="relu", d_modle=8)  # unknown keys are errors, not ignored
    with pytest.raises(ValueError, match="key 'moe' applies to an MoE layer"):
        ffnlab.FFN(variant="relu", d_model=8, moe={"num_experts": 4})  # a key it would not read
    with pytest.raises(ValueError, match="must be a dict"):
        ffnlab.FFN([1, 2, 3])
    with pytest.raises(ValueError, match="d_model"):
        ffnlab.params(variant="relu", d_model=-4)


@pytest.mark.parametrize("x, message", [
    (np.ones((3, 8), dtype=np.float64), "float32"),
    (np.ones((3, 8), dtype=np.int32), "float32"),
    (np.ones((3, 7), dtype=np.float32), r"shape \[T, 8\], got \[3, 7\]"),
    (np.ones((3, 8, 1), dtype=np.float32), r"shape \[T, 8\]"),
    (np.ones(8, dtype=np.float32), r"shape \[T, 8\]"),
    (np.ones((16, 8), dtype=np.float32)[::2], "C-contiguous"),
    (np.asfortranarray(np.ones((3, 8), dtype=np.float32)), "C-contiguous"),
    (np.ones((3, 8), dtype=">f4"), "float32"),  # the other byte order
    (np.frombuffer(bytearray(3 * 8 * 4 + 1), dtype=np.float32, offset=1).reshape(3, 8),
     "aligned to its 4-byte floats"),
])
def test_bad_arrays_are_refused(x, message):
    with pytest.raises(ValueError, match=message):
        layer().forward(x)


def test_a_float32_dtype_made_another_way_is_float32():
    x = np.ones((3, 8), dtype=np.dtype("float32", metadata={"unit": "none"}))
    assert x.dtype is not np.dtype(np.float32)
    np.testing.assert_array_equal(layer().forward(x), layer().forward(np.ones((3, 8), np.float32)))


X = np.ones((4, 8), dtype=np.float32)


# Every argument of the layer API in ffnlab's words: a ValueError naming the call and the
# argument, never pybind11's TypeError with its signature dump.
@pytest.mark.parametrize("call, named", [
    (lambda: ffnlab.FFN(variant="relu", d_model=8, d_ff=16, seed=-1), "FFN: seed"),
    (lambda: ffnlab.FFN(variant="relu", d_model=8, d_ff=16, seed=None), "FFN: seed"),
    (lambda: ffnlab.FFN(variant="relu", d_model=8, d_ff=16, seed=1.5), "FFN: seed"),
    (lambda: layer().forward([[1.0] * 8] * 4), "forward: x must be a float32 numpy array"),
    (lambda: layer().forward(None), "forward: x"),
    (lambda: layer().forward(X, train="yes"), "forward: train must be True or False"),
    (lambda: layer().forward(X, train=None), "forward: train"),
    (lambda: layer().forward(X, sequence=-1), "forward: sequence"),
    (lambda: layer().backward([[1.0] * 8] * 4), "backward: dy"),
    (lambda: setattr(layer(), "precision", None), "FFN: precision must be a string"),
    (lambda: setattr(layer(), "inference_weights", 16), "FFN: inference_weights"),
    (lambda: layer().set_aux_loss_scale("a"), "set_aux_loss_scale: scale"),
    (lambda: ffnlab.params(variant="relu", tokens="8"), "params: tokens"),
    (lambda: ffnlab.params(variant="relu", tokens=2 ** 33), r"params: tokens .*\[0, 4294967296\]"),
    (lambda: ffnlab.set_threads(2 ** 40), "set_threads"),
    (lambda: ffnlab.set_threads("2"), "set_threads: n must be an integer"),
    (lambda: ffnlab.set_conv_min_rows(2 ** 70), "set_conv_min_rows: rows"),
    (lambda: ffnlab.from_hf(3), "from_hf: config_path must be a path"),
    (lambda: ffnlab.study_ffn("relu", 8.0), "study_ffn: d_model must be an integer"),
    (lambda: ffnlab.study_ffn(3), "study_ffn: variant must be a string"),
])
def test_bad_arguments_name_the_call_and_the_argument(call, named):
    with pytest.raises(ValueError, match=named):
        call()


def test_batches_larger_than_memory_are_refused_before_any_work(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a few bytes of text for the batches " * 4)
    with pytest.raises(ValueError, match=r"\[python\] the batches of 1000000000 steps .* needs "
                                         r".* GiB, more than"):
        ffnlab.training_batches(corpus, 10 ** 9, batch=2 ** 20, seq=2 ** 10)


def test_hash_routing_takes_integer_token_ids_only():
    moe = ffnlab.FFN(variant="moe", d_model=8, d_ff=16, moe={"routing": "hash"})
    ids = [1, 2, 3, 4]
    y = moe.forward(X, token_ids=ids)
    assert np.array_equal(moe.forward(X, token_ids=np.array(ids, dtype=np.uint8)), y)
    with pytest.raises(ValueError, match="token_ids must be integers"):
        moe.forward(X, token_ids=[1.9, 2.9, 3.9, 4.9])  # not truncated to 1, 2, 3, 4


def test_a_training_forward_that_fails_leaves_no_backward():
    moe = ffnlab.FFN(variant="moe", d_model=8, d_ff=16, moe={"routing": "expert_choice"})
    moe.forward(X, train=True)
    moe.backward(np.ones_like(X))
    with pytest.raises(ValueError, match="not whole sequences of 3"):
        moe.forward(X + 1, train=True, sequence=3)  # refused by the layer itself
    with pytest.raises(ValueError, match="backward needs a forward with train = true"):
        moe.backward(np.ones_like(X))


def test_backward_needs_a_training_forward_of_the_same_shape():
    l = layer()
    x = np.ones((4, 8), dtype=np.float32)
    with pytest.raises(ValueError, match="backward needs a forward with train = true"):
        l.backward(x)
    l.forward(x, train=True)
    with pytest.raises(ValueError, match=r"dy \[5, 8\] must match"):
        l.backward(np.ones((5, 8), dtype=np.float32))
    l.forward(x)  # an inference forward drops what backward needed
    with pytest.raises(ValueError, match="backward needs a forward with train = true"):
        l.backward(x)


def test_bad_values_for_settings():
    l = layer()
    with pytest.raises(ValueError, match="precision"):
        l.precision = "fp8"
    with pytest.raises(ValueError, match="inference_weights"):
        l.inference_weights = "int8"
    with pytest.raises(ValueError, match="threads"):
        ffnlab.set_threads(0)


def test_files_that_are_missing_or_not_json(tmp_path):
    with pytest.raises((OSError, ValueError), match="nothere.json"):
        ffnlab.from_hf(str(tmp_path / "nothere.json"))
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError):
        ffnlab.from_hf(str(bad))


def test_aux_loss_scale_must_be_finite():
    moe = ffnlab.FFN(variant="moe", d_model=8, d_ff=16)
    for bad in (float("nan"), float("inf"), 1e39):  # 1e39 overflows float32 to inf
        with pytest.raises(ValueError, match="scale must be a finite"):
            moe.set_aux_loss_scale(bad)


def test_empty_input_gives_empty_output():
    y = layer().forward(np.zeros((0, 8), dtype=np.float32))
    assert y.shape == (0, 8)


@pytest.mark.parametrize("routing", ["topk", "top_p", "relu", "expert_choice", "soft", "hash",
                                     "base"])
def test_empty_input_trains_every_routing_to_nothing(routing):
    # No rows: a training forward and backward give empty outputs, add nothing to any gradient,
    # and every statistic and the aux loss stay finite (no 0/0).
    moe = ffnlab.FFN(variant="moe", d_model=8, d_ff=16,
                     moe={"routing": routing, "num_shared": 1})
    none = np.zeros((0, 8), dtype=np.float32)
    ids = np.zeros(0, np.int64) if routing == "hash" else None
    assert moe.forward(none, train=True, token_ids=ids).shape == (0, 8)
    assert moe.backward(none).shape == (0, 8)
    assert all(not g.any() for g in moe.grads().values())
    assert math.isfinite(moe.aux_loss)
    stats = moe.stats()
    for key, value in stats.items():
        values = np.asarray(value, dtype=float) if not isinstance(value, dict) else np.zeros(0)
        assert np.isfinite(values).all(), (key, value)
    moe.after_optimizer_step()


def test_a_layer_larger_than_memory_is_refused_before_allocation():
    with pytest.raises(ValueError, match=r"\[python\] a layer of .* parameters .* needs .* GiB, "
                                         r"more than the .* GiB available"):
        ffnlab.FFN(variant="swiglu", d_model=65536, d_ff=1 << 20)
    # The language model too (about 4.3e12 parameters: more than any machine here holds).
    with pytest.raises(ValueError, match=r"\[python\] a model of .* parameters .* needs .* GiB, "
                                         r"more than the .* GiB available"):
        ffnlab.TransformerLM(d_model=65536, layers=64, heads=512, variant="relu", d_ff=1 << 20)


# --- ffnlab.evolve and ffnlab.train: every argument's type and value, in ffnlab's words ----------

def case_id(value):
    return ",".join(f"{k}={v!r}" for k, v in value.items()) if isinstance(value, dict) else ""


def one_line(error, *parts):
    """The message of a refusal: one line, ffnlab's, naming what it is given as parts."""
    text = str(error.value)
    assert "\n" not in text, text
    assert "Unable to cast" not in text and "incompatible function arguments" not in text, text
    for part in parts:
        assert part in text, (part, text)
    return text


@pytest.mark.parametrize("options, named", [
    (dict(margin="x"), ["evolve: margin must be a number in (0, 1]", "got 'x'"]),
    (dict(margin=float("nan")), ["evolve: margin must be", "got nan"]),
    (dict(margin=True), ["evolve: margin must be", "got True"]),
    (dict(margin=0), ["evolve: margin must be", "got 0"]),
    (dict(margin=1e-50), ["evolve: margin must be", "got 1e-50"]),  # 0 in single precision
    (dict(steps=2**70), ["evolve: steps must be an integer in [1, 1000000000]",
                         "got 1180591620717411303424"]),
    (dict(steps=1.5), ["evolve: steps must be an integer", "got 1.5"]),
    (dict(steps="40"), ["evolve: steps must be an integer", "got '40'"]),
    (dict(steps=0), ["evolve: steps must be an integer in [1, 1000000000]", "got 0"]),
    (dict(seeds=0), ["evolve: seeds must be an integer in [1, 1000]", "got 0"]),
    (dict(seeds=True), ["evolve: seeds must be an integer", "got True"]),
    (dict(max_seeds="3"), ["evolve: max_seeds must be an integer", "got '3'"]),
    (dict(routing_seeds=2**40), ["evolve: routing_seeds must be an integer in [1, 1000]",
                                 "got 1099511627776"]),
    (dict(quick="yes"), ["evolve: quick must be True or False", "got 'yes'"]),
    (dict(full=1), ["evolve: full must be True or False", "got 1"]),
    (dict(sweep=[]), ["evolve: sweep must be True or False", "got []"]),
    (dict(variants=["relu", 5]), ["evolve: variants[1] must be a variant name (a string)",
                                  "got 5"]),
    (dict(variants="relu,swiglu"), ["evolve: variants must be a list of variant names",
                                    "got 'relu,swiglu'"]),
    (dict(variants=5), ["evolve: variants must be a list of variant names", "got 5"]),
    (dict(variants=[]), ["evolve: variants is empty", "that includes 'relu'"]),
    (dict(variants=""), ["evolve: variants is empty", "that includes 'relu'"]),
    (dict(data=5), ["evolve: data must be a path", "got 5"]),
    (dict(data=""), ["evolve: data must be a path", "not empty", "got ''"]),
    (dict(data="a\0b"), ["evolve: data must be a path without NUL characters"]),
    (dict(progress="bar"), ["evolve: progress must be True, False, None or a callable",
                            "got 'bar'"]),
], ids=case_id)
def test_evolve_refuses_a_wrong_argument_naming_it_and_its_value(tmp_path, options, named):
    with pytest.raises(ValueError) as e:
        ffnlab.evolve(tmp_path / "r", **dict(dict(progress=False), **options))
    assert one_line(e, *named).startswith("[python] evolve: ")
    assert list(tmp_path.iterdir()) == []  # refused before any work


@pytest.mark.parametrize("out", [5, "", b""])
def test_evolve_refuses_an_out_that_is_no_path(out):
    with pytest.raises(ValueError) as e:
        ffnlab.evolve(out, progress=False)
    one_line(e, "[python] evolve: out must be a path (a str or os.PathLike), not empty",
             f"got {out!r}")


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    return path


class Opaque:
    def __repr__(self):
        return "<opaque>"


LM_KEYS = dict(d_model=16, layers=1, heads=2, context=16)


@pytest.mark.parametrize("arguments, named", [
    (dict(data=5), ["[python] train: data must be a path", "got 5"]),
    (dict(data=None), ["[python] train: data must be a path", "got None"]),
    (dict(out=3.5), ["[python] train: out must be a path", "got 3.5"]),
    (dict(out=""), ["[python] train: out must be a path", "not empty", "got ''"]),
    (dict(resume=["run"]), ["[python] train: resume must be a path", "got ['run']"]),
    (dict(force="yes"), ["[python] train: force must be True or False", "got 'yes'"]),
    (dict(val_fraction=0), ["[python] train: val_fraction must be a number in (0, 1) (None: ",
                            "got 0"]),
    (dict(val_fraction=1.5), ["val_fraction must be a number in (0, 1)", "got 1.5"]),
    (dict(progress="bar"), ["[python] train: progress must be True, False, None or a callable",
                            "got 'bar'"]),
    # The training settings: JSON keys, judged by the library's key table or, for what JSON
    # cannot hold, on the way there.
    (dict(steps=2**70), ["[config] key 'steps' = 1180591620717411303424 is out of range"]),
    (dict(steps="5"), ["key 'steps' must be an integer", '"5"']),
    (dict(steps=True), ["key 'steps' must be an integer", "true"]),
    (dict(lr="x"), ["key 'lr' must be a number", '"x"']),
    (dict(lr=float("nan")), ["[config] key 'lr' must be a finite number, got nan"]),
    (dict(lr=float("-inf")), ["[config] key 'lr' must be a finite number, got -inf"]),
    # A value other than 0 that float rounds to 0 (clipping would be off).
    (dict(clip=1e-50), ["key 'clip' must be 0 or a number that a float", "got 1e-50"]),
    # A setting of another optimizer than the run's.
    (dict(optimizer="sgd", beta2=0.9), ["[train] beta2 = 0.9: an Adam setting, which the sgd"]),
    # What writes a folder, without one.
    (dict(checkpoint_every=1), ["[train] checkpoint_every = 1: checkpoints are written into a",
                                "(name one with out or resume=)"]),
    (dict(force=True), ["[train] nothing to force: this run writes no folder"]),
    (dict(seq=[32]), ["key 'seq' must be an integer", "[32]"]),
    (dict(eval_tokens=Opaque()), ["[config] key 'eval_tokens' must be a number, a string",
                                  "got <opaque> (a Opaque)"]),
], ids=case_id)
def test_train_refuses_a_wrong_argument_naming_it_and_its_value(text_file, arguments, named):
    lm = ffnlab.TransformerLM(**LM_KEYS)
    before = lm.weights()
    arguments = dict(dict(data=text_file, steps=2, batch=2, seq=16, progress=False), **arguments)
    with pytest.raises(ValueError) as e:
        ffnlab.train(lm, **arguments)
    one_line(e, *named)
    assert lm.weights() == before  # not trained


def test_train_refuses_what_is_not_a_model(text_file):
    with pytest.raises(ValueError) as e:
        ffnlab.train("lm", text_file, steps=2, progress=False)
    one_line(e, "[python] train: model must be an ffnlab.TransformerLM", "got 'lm'")


# --- configs from keyword arguments: what JSON cannot hold, refused by key ---------------------

@pytest.mark.parametrize("make, message", [
    (lambda: ffnlab.FFN(variant="swiglu", d_model=8, d_ff=16, swish_beta=float("nan")),
     "[config] key 'swish_beta' must be a finite number, got nan"),
    (lambda: ffnlab.FFN({"variant": "swiglu", "swish_beta": float("inf")}, d_model=8),
     "[config] key 'swish_beta' must be a finite number, got inf"),
    (lambda: ffnlab.FFN(variant="moe", d_model=8, moe={"num_experts": 2, "top_k": 1,
                                                        "aux_coef": float("-inf")}),
     "[config] key 'moe.aux_coef' must be a finite number, got -inf"),
    (lambda: ffnlab.config(variant="swiglu", swish_beta=float("nan")),
     "[config] key 'swish_beta' must be a finite number, got nan"),
    (lambda: ffnlab.params(variant="swiglu", swish_beta=float("nan")),
     "[config] key 'swish_beta' must be a finite number, got nan"),
    (lambda: ffnlab.TransformerLM(dropout=float("nan"), **LM_KEYS),
     "[config] key 'dropout' must be a finite number, got nan"),
    (lambda: ffnlab.TransformerLM({"ffn": {"variant": "swiglu", "d_model": 16,
                                           "swish_beta": float("nan")}}, **LM_KEYS),
     "[config] key 'ffn.swish_beta' must be a finite number, got nan"),
    (lambda: ffnlab.FFN(variant="relu", d_model=2**64),
     "[config] key 'd_model' = 18446744073709551616 is out of range (beyond 64 bits)"),
    (lambda: ffnlab.FFN(variant="relu", d_model=np.ones(2)),
     "[config] key 'd_model' must be a number, a string, a bool, a list or a dict, got "
     "array([1., 1.]) (a numpy.ndarray)"),
    (lambda: ffnlab.FFN({"variant": "moe", "moe": {1: 2}}),
     "[config] key 'moe' has a key 1 that is not a string"),
])
def test_a_value_json_cannot_hold_is_refused_naming_its_key(make, message):
    with pytest.raises(ValueError) as e:
        make()
    assert str(e.value) == message


def test_numpy_scalars_are_config_values():
    layer = ffnlab.FFN(variant="swiglu", d_model=np.int64(8), d_ff=np.int32(16),
                       swish_beta=np.float32(1.5))
    assert layer.config["d_model"] == 8 and layer.config["swish_beta"] == 1.5


# --- The gradient of the router logits, only where there are logits ----------------------------

@pytest.mark.parametrize("config", [
    dict(variant="relu", d_model=8, d_ff=16),
    dict(variant="moe", d_model=8, d_ff=16, moe={"num_experts": 4, "top_k": 2, "routing": "hash"}),
])
def test_dlogits_is_refused_by_a_layer_without_router_logits(config):
    layer = ffnlab.FFN(**config)
    x = np.ones((3, 8), dtype=np.float32)
    hashed = config.get("moe", {}).get("routing") == "hash"
    layer.forward(x, train=True, token_ids=[1, 2, 3] if hashed else None)
    with pytest.raises(ValueError) as e:
        layer.backward(np.ones_like(x), dlogits=np.ones((3, 4), dtype=np.float32))
    assert str(e.value) == ("[python] dlogits given, but the layer has no router logits to take "
                            "it (an MoE whose router is a Linear has)")
    assert all(not g.any() for g in layer.grads().values())  # no backward ran
    layer.backward(np.ones_like(x))  # the layer is still ready for its backward


def test_a_run_folder_the_system_cannot_look_at_is_one_error_naming_it():
    too_long = "/tmp/" + "x" * 5000  # ENAMETOOLONG, once a RuntimeError from the filesystem
    with pytest.raises(ValueError, match=r"^\[checkpoint\] /tmp/xxx"):
        ffnlab.TransformerLM.from_run(too_long)


def test_a_keyword_dict_merges_into_the_configs_dict():
    layer = ffnlab.FFN({"variant": "moe", "d_model": 8, "d_ff": 16, "moe": {"num_experts": 16}},
                       moe={"top_k": 4})
    assert layer.config["moe"]["num_experts"] == 16 and layer.config["moe"]["top_k"] == 4
    lm = ffnlab.TransformerLM({"d_model": 16, "layers": 1, "heads": 2,
                               "ffn": {"variant": "moe", "d_model": 16,
                                       "moe": {"num_experts": 6}}},
                              ffn={"moe": {"top_k": 3}})
    assert lm.config["ffn"]["moe"]["num_experts"] == 6 and lm.config["ffn"]["moe"]["top_k"] == 3
    # A dict naming a variant is another layer: it replaces the config's, as study_ffn's does.
    swiglu = ffnlab.TransformerLM(lm.config, ffn=ffnlab.study_ffn("swiglu", 16))
    assert swiglu.config["ffn"]["kind"] == "glu" and "moe" not in swiglu.config["ffn"]
    # A routing change brings that routing's defaults for the keys it sets (relu: no normalize).
    relu = ffnlab.FFN(layer.config, moe={"routing": "relu"})
    assert relu.config["moe"]["routing"] == "relu" and relu.config["moe"]["normalize"] is False
    assert relu.config["moe"]["num_experts"] == 16
