"""RandomChannelMix and LocalContrastNorm: the colour-blind grey view of the captioning model's shape stream."""
import numpy as np
import pytest
from scipy import ndimage

from seqapps.layers.image_streams import LocalContrastNorm, RandomChannelMix
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


def _local_contrast_reference(image: np.ndarray, sigma: float, min_deviation: float, epsilon: float) -> np.ndarray:
    """The normalisation in NumPy: scipy's Gaussian (mirrored edges, the same reach) for the local statistics."""
    def smooth(x: np.ndarray) -> np.ndarray:
        return ndimage.gaussian_filter(x, sigma, mode="mirror", truncate=int(3 * sigma + 0.5) / sigma)

    centred = image - smooth(image)
    deviation = np.sqrt(np.maximum(smooth(centred ** 2), 0.0))
    return centred / np.maximum(deviation, max(deviation.mean(), min_deviation) + epsilon)


@pytest.mark.parametrize("sigma, min_deviation", [(1.0, 0.0), (2.5, 0.0), (1.0, 0.05)])
def test_local_contrast_norm_equals_a_scipy_reference(sigma, min_deviation):
    images = np.random.default_rng(3).uniform(0, 1, (3, 20, 17, 1)).astype("float64")
    images[1] *= 0.1  # a low-contrast image: its floor is its own mean deviation, or min_deviation above it
    found = LocalContrastNorm(sigma=sigma, min_deviation=min_deviation, dtype="float64")(images).numpy()
    for image, out in zip(images, found):
        # float64 on both sides: the two differ only by summation order
        expected = _local_contrast_reference(image[..., 0], sigma, min_deviation, 1e-3)
        np.testing.assert_allclose(out[..., 0], expected, atol=1e-9)


def test_a_deviation_floor_keeps_faint_texture_faint():
    faint = np.random.default_rng(4).uniform(0.45, 0.55, (1, 24, 24, 1)).astype("float32")
    with_floor = LocalContrastNorm(sigma=2.0, min_deviation=0.1)(faint).numpy()
    without = LocalContrastNorm(sigma=2.0)(faint).numpy()
    # the faint texture's deviation (about 0.03) is below the floor: divided by 0.1, not scaled up to unit contrast
    assert np.abs(with_floor).max() < 1 < np.abs(without).max()


def test_local_contrast_norm_ignores_the_background_level_and_reads_a_filled_and_an_outlined_square_alike():
    filled, outlined = np.full((2, 32, 32), 0.9), np.full((32, 32), 0.9)
    filled[0, 10:22, 10:22] = filled[1, 10:22, 10:22] = 0.3
    filled[1] -= 0.4  # the same square on a darker background
    outlined[10:22, 10:22] = 0.3
    outlined[12:20, 12:20] = 0.9
    views = LocalContrastNorm(sigma=2.0)(np.concatenate([filled, outlined[None]])[..., None].astype("float32"))
    views = views.numpy()[..., 0]
    np.testing.assert_allclose(views[0], views[1], atol=1e-4)  # a shift of the level changes nothing
    boundary = np.zeros((32, 32), bool)
    boundary[10:22, 10:22] = True
    boundary[12:20, 12:20] = False  # the ring where both squares are drawn
    # on the ring where both are drawn, both views are dark against their surroundings
    assert np.all(views[0][boundary] < 0) and np.all(views[2][boundary] < 0)


def test_local_contrast_norm_layer_harness():
    run_layer_test(LocalContrastNorm, {"sigma": 1.0}, np.random.default_rng(0).uniform(0, 1, (4, 9, 8, 1)).astype("float32"),
                   expected_output_shape=(4, 9, 8, 1), expected_num_trainable_weights=0,
                   expected_num_non_trainable_weights=0,
                   other_input_data=np.random.default_rng(1).uniform(0, 1, (2, 9, 8, 1)).astype("float32"),
                   not_applicable={"fit": "the layer has no weights to train"})
