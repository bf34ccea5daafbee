"""RandomChannelMix: the colour-blind grey view of the captioning model's shape stream."""
import numpy as np

from seqapps.layers.image_streams import RandomChannelMix
from tests.layers.harness import run_layer_test


def _images(seed: int = 0, batch: int = 6) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 1, (batch, 5, 4, 3)).astype("float32")


def test_inference_takes_the_mean_of_the_channels():
    images = _images()
    np.testing.assert_allclose(np.asarray(RandomChannelMix(seed=1)(images)), images.mean(-1, keepdims=True),
                               rtol=1e-6)


def test_training_mixes_each_image_by_its_own_convex_weights():
    batch = 200
    layer = RandomChannelMix(seed=3)
    images = _images(seed=1, batch=batch)
    mixed = np.asarray(layer(images, training=True))[..., 0]
    # the per-image weights solve images @ w = mixed (20 pixels, 3 unknowns) exactly
    weights = np.stack([np.linalg.lstsq(image.reshape(-1, 3), out.reshape(-1), rcond=None)[0]
                        for image, out in zip(images, mixed)])
    np.testing.assert_allclose(weights.sum(1), 1.0, atol=1e-5)
    assert weights.min() > -1e-5
    # a flat Dirichlet: each weight's mean is 1/3 and its variance 1/18 (200 draws: 4 standard errors)
    np.testing.assert_allclose(weights.mean(0), 1 / 3, atol=4 * np.sqrt(1 / 18 / batch))
    assert len(np.unique(weights.round(4), axis=0)) == batch


def test_the_draws_repeat_under_the_seed_and_differ_across_seeds():
    images = _images()
    first, again, other = (np.asarray(RandomChannelMix(seed=seed)(images, training=True)) for seed in (5, 5, 6))
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, other)


def test_random_channel_mix_layer_harness():
    run_layer_test(RandomChannelMix, {"seed": 2}, _images(), expected_output_shape=(6, 5, 4, 1),
                   expected_num_trainable_weights=0, expected_num_non_trainable_weights=0,
                   other_input_data=_images(batch=2), not_applicable={"fit": "the layer has no weights to train"})
