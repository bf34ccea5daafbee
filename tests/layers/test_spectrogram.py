"""SpecAugment and TimeStatistics: the shared layer harness, NumPy references, masking only while training."""
import numpy as np
import pytest

from seqapps.layers.spectrogram import SpecAugment, TimeStatistics
from tests.layers.harness import run_layer_test


def test_time_statistics_match_numpy_and_pass_the_harness():
    x = np.random.default_rng(0).standard_normal((2, 5, 3)).astype(np.float32)
    layer = run_layer_test(TimeStatistics, {"statistics": ["mean", "std", "max"]}, x, expected_output_shape=(2, 9),
                           expected_num_trainable_weights=0, expected_num_non_trainable_weights=0,
                           other_input_data=x[:1, :3], not_applicable={"fit": "the layer has no weights"}, atol=1e-5)
    expected = np.concatenate([x.mean(axis=1), x.std(axis=1), x.max(axis=1)], axis=-1)
    np.testing.assert_allclose(layer(x).numpy(), expected, rtol=1e-5, atol=1e-6)  # float32 reductions
    with pytest.raises(ValueError, match="statistics"):
        TimeStatistics(("median",))


def test_spec_augment_masks_whole_frames_and_bands_only_while_training():
    x = np.ones((4, 30, 16), np.float32)
    run_layer_test(SpecAugment, {"masks": 2, "max_frames": 5, "max_bands": 3, "seed": 0}, x,
                   expected_output_shape=(4, 30, 16), expected_num_trainable_weights=0,
                   expected_num_non_trainable_weights=0, other_input_data=x[:2, :20],
                   not_applicable={"fit": "the layer has no weights"})
    layer = SpecAugment(masks=2, max_frames=5, max_bands=3, seed=0)
    np.testing.assert_array_equal(layer(x, training=False).numpy(), x)
    masked = layer(x, training=True).numpy()
    for example in masked:  # a masked value lies in an all-zero frame or an all-zero band; at most 2 x 5 frames
        zero_frames, zero_bands = (example == 0).all(axis=1), (example == 0).all(axis=0)
        assert np.all((example == 1) | zero_frames[:, None] | zero_bands[None, :])
        assert zero_frames.sum() <= 10 and zero_bands.sum() <= 6
    assert (masked == 0).any()
    with pytest.raises(ValueError, match="SpecAugment"):
        SpecAugment(masks=-1)
