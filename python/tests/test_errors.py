"""Bad configs, shapes, dtypes and layouts arrive as Python exceptions with ffnlab's one-line
message; nothing out of bounds is read."""

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
])
def test_bad_arrays_are_refused(x, message):
    with pytest.raises(ValueError, match=message):
        layer().forward(x)


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


def test_empty_input_gives_empty_output():
    y = layer().forward(np.zeros((0, 8), dtype=np.float32))
    assert y.shape == (0, 8)


def test_a_layer_larger_than_memory_is_refused_before_allocation():
    with pytest.raises(ValueError, match=r"\[python\] a layer of .* parameters .* needs .* GiB, "
                                         r"more than the .* GiB available"):
        ffnlab.FFN(variant="swiglu", d_model=65536, d_ff=1 << 20)
