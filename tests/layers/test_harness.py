"""The layer harness fails on the bugs it exists to find (each layer here has one), and restores the policy."""
import keras
import numpy as np
import pytest

from tests.layers.harness import run_layer_test

X = np.ones((2, 3, 4), "float32")
SHAPES = {"expected_output_shape": (2, 3, 4), "other_input_data": X[:1, :2]}


@keras.saving.register_keras_serializable(package="seqapps_tests")
class ForgetsItsScale(keras.layers.Layer):
    """``get_config`` lacks the ``scale`` argument."""

    def __init__(self, scale: float = 2.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.scale = scale

    def call(self, x):
        return x * self.scale

    def get_config(self) -> dict:
        return super().get_config()


@keras.saving.register_keras_serializable(package="seqapps_tests")
class AlwaysFloat32(keras.layers.Layer):
    """Returns float32 whatever the dtype policy."""

    def build(self, input_shape) -> None:
        self.scale = self.add_weight(shape=(input_shape[-1],))

    def call(self, x):
        return keras.ops.cast(x * self.scale, "float32")


@keras.saving.register_keras_serializable(package="seqapps_tests")
class UnusedWeight(keras.layers.Layer):
    """Has a trainable weight that the output does not depend on."""

    def build(self, input_shape) -> None:
        self.scale = self.add_weight(shape=(input_shape[-1],))
        self.unused = self.add_weight(shape=(1,))

    def call(self, x):
        return x * self.scale


def test_a_missing_config_argument_fails():
    with pytest.raises(AssertionError, match=r"lacks the init arguments \['scale'\]"):
        run_layer_test(ForgetsItsScale, {}, X, expected_num_trainable_weights=0, expected_num_non_trainable_weights=0,
                       not_applicable={"fit": "no weights"}, **SHAPES)


def test_a_float32_output_under_mixed_precision_fails_and_the_policy_is_restored():
    with pytest.raises(AssertionError, match="a float32 output of a float16 layer"):
        run_layer_test(AlwaysFloat32, {}, X, expected_num_trainable_weights=1, expected_num_non_trainable_weights=0,
                       **SHAPES)
    assert keras.config.dtype_policy().name == "float32"


def test_an_untrained_weight_and_a_wrong_weight_count_fail():
    with pytest.raises(AssertionError, match="left these weights unchanged"):
        run_layer_test(UnusedWeight, {}, X, expected_num_trainable_weights=2, expected_num_non_trainable_weights=0,
                       **SHAPES)
    with pytest.raises(AssertionError, match="unused"):
        run_layer_test(UnusedWeight, {}, X, expected_num_trainable_weights=1, expected_num_non_trainable_weights=0,
                       **SHAPES)


def test_a_skipped_check_needs_a_reason():
    with pytest.raises(AssertionError, match="no fit step"):
        run_layer_test(AlwaysFloat32, {}, X, expected_num_trainable_weights=0, expected_num_non_trainable_weights=0,
                       **SHAPES)
    with pytest.raises(AssertionError, match="say why"):
        run_layer_test(AlwaysFloat32, {}, X, expected_num_trainable_weights=1, expected_num_non_trainable_weights=0,
                       not_applicable={"tf_function": ""}, **SHAPES)
