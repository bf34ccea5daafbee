"""Tests of the in-graph waveform augmentations (seqapps.layers.augment) against NumPy, SciPy and librosa."""
import librosa
import numpy as np
import pytest
import tensorflow as tf
from scipy import signal

from seqapps.layers import augment

RATE = 16000


def _tone(frequency: float, seconds: float = 1.0) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * frequency * np.arange(int(seconds * RATE)) / RATE)).astype(np.float32)


def _peak(waveform: np.ndarray) -> float:
    """The frequency (Hz) of the largest bin of the waveform's Hann-windowed spectrum."""
    spectrum = np.abs(np.fft.rfft(waveform * np.hanning(waveform.size), 8 * waveform.size))
    return float(np.argmax(spectrum) * RATE / (8 * waveform.size))


def _batch(rng: np.random.Generator, lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
    waveform = np.zeros((len(lengths), max(lengths)), np.float32)
    for row, n in enumerate(lengths):
        waveform[row, :n] = 0.3 * rng.standard_normal(n)
    return waveform, np.array(lengths, np.int32)


def test_noise_is_added_at_the_drawn_snr_over_the_valid_samples():
    rng = np.random.default_rng(0)
    waveform, length = _batch(rng, [16000, 9000, 12345])
    snr = np.array([5.0, 17.3, 30.0], np.float32)
    noise = rng.standard_normal(waveform.shape).astype(np.float32) * 3.0
    noisy = augment.add_noise(waveform, length, snr, noise).numpy()
    for row, n in enumerate(length):
        added = noisy[row, :n] - waveform[row, :n]
        measured = 10 * np.log10(np.sum(waveform[row, :n] ** 2) / np.sum(added ** 2))
        assert abs(measured - snr[row]) < 0.1
        assert not noisy[row, n:].any()  # the padding stays silent


def test_reverberation_is_the_convolution_scipy_computes_and_decays_60_db_in_rt60():
    rng = np.random.default_rng(1)
    waveform, length = _batch(rng, [8000, 5000])
    rt60 = np.array([0.2, 0.5], np.float32)
    taps = rng.standard_normal((2, int(0.6 * RATE))).astype(np.float32)
    impulse = augment.impulse_responses(rt60, taps, RATE).numpy()
    np.testing.assert_allclose(np.sum(impulse ** 2, axis=1), 1.0, rtol=1e-5)
    envelope = augment.impulse_responses(rt60, np.ones_like(taps), RATE).numpy()
    for row, seconds in enumerate(rt60):  # -60 dB after rt60 seconds
        assert envelope[row, int(seconds * RATE)] / envelope[row, 0] == pytest.approx(1e-3, rel=1e-2)
    wet = np.array([0.3, 1.0], np.float32)
    out = augment.reverberate(waveform, length, impulse, wet).numpy()
    for row, n in enumerate(length):
        expected = waveform[row, :n] + wet[row] * signal.fftconvolve(waveform[row, :n], impulse[row])[:n]
        np.testing.assert_allclose(out[row, :n], expected, atol=2e-5)
        assert not out[row, n:].any()


def test_telephone_band_removes_what_numpys_fft_finds_outside_300_to_3400_hz():
    rng = np.random.default_rng(2)
    waveform, length = _batch(rng, [RATE])
    out = augment.band_limit(waveform, length, RATE).numpy()[0]
    frequencies = np.fft.rfftfreq(RATE, 1 / RATE)
    inside = (frequencies >= 300) & (frequencies <= 3400)
    spectrum, original = np.abs(np.fft.rfft(out)) ** 2, np.abs(np.fft.rfft(waveform[0])) ** 2
    assert spectrum[~inside].sum() < 1e-8 * spectrum[inside].sum()
    np.testing.assert_allclose(spectrum[inside], original[inside], rtol=1e-3, atol=1e-3 * original.mean())


@pytest.mark.parametrize("factor", [0.9, 1.1])
def test_speed_changes_length_and_frequency_by_the_factor_as_librosa_resampling_does(factor):
    tone = _tone(440.0)
    waveform, length = augment.change_speed(tone[None], [tone.size], tf.constant([factor]), RATE)
    out = waveform.numpy()[0]
    assert int(length[0]) == out.size == int(np.ceil(tone.size / factor))
    assert _peak(out) == pytest.approx(440.0 * factor, abs=1.0)
    reference = librosa.resample(tone, orig_sr=round(RATE * factor), target_sr=RATE)
    assert abs(reference.size - out.size) <= 1
    middle = slice(500, min(reference.size, out.size) - 500)  # away from the filters' edges
    np.testing.assert_allclose(out[middle], reference[middle], atol=2e-3)


@pytest.mark.parametrize("semitones", [-2.0, 2.0])
def test_pitch_shift_moves_the_pitch_as_librosa_and_keeps_the_length(semitones):
    tone = _tone(440.0)
    out = augment.shift_pitch(tone[None], [tone.size], tf.constant([semitones]), RATE).numpy()[0]
    reference = librosa.effects.pitch_shift(tone, sr=RATE, n_steps=semitones)
    assert out.size == tone.size
    expected = 440.0 * 2 ** (semitones / 12)
    assert _peak(out[2000:-2000]) == pytest.approx(expected, abs=2.0)
    assert _peak(out[2000:-2000]) == pytest.approx(_peak(reference[2000:-2000]), abs=2.0)
    # the level is kept as librosa keeps it
    rms = [np.sqrt(np.mean(w[2000:-2000] ** 2)) for w in (out, reference)]
    assert rms[0] == pytest.approx(rms[1], rel=0.1)


def test_the_layer_is_deterministic_under_its_seed_and_the_identity_outside_training():
    rng = np.random.default_rng(3)
    waveform, length = _batch(rng, [8000, 6000, 7000, 4000])
    inputs = {"waveform": waveform, "length": length}

    def run(seed: int) -> dict[str, np.ndarray]:
        layer = augment.WaveformAugment(augment.AUGMENTATIONS, RATE, probability=0.5, seed=seed)
        return {key: value.numpy() for key, value in layer(inputs, training=True).items()}

    first, again, other = run(7), run(7), run(8)
    np.testing.assert_array_equal(first["waveform"], again["waveform"])
    np.testing.assert_array_equal(first["length"], again["length"])
    assert first["waveform"].shape != other["waveform"].shape or not np.array_equal(first["waveform"],
                                                                                     other["waveform"])
    assert set(first["length"]) <= {int(np.ceil(n / f)) for n in length for f in augment.SPEED_FACTORS}
    plain = augment.WaveformAugment(augment.AUGMENTATIONS, RATE, seed=7)(inputs, training=False)
    np.testing.assert_array_equal(plain["waveform"].numpy(), waveform)


def test_speed_never_leaves_an_example_fewer_samples_than_it_needs():
    waveform, length = _batch(np.random.default_rng(4), [8000] * 8)
    layer = augment.WaveformAugment(["speed"], RATE, seed=0)
    out = layer({"waveform": waveform, "length": length}, min_length=tf.fill([8], 8000), training=True)
    np.testing.assert_array_equal(out["length"].numpy() >= 8000, True)  # 1.1 would leave 7,273


def test_the_layer_round_trips_its_config():
    layer = augment.WaveformAugment(["noise", "speed"], 8000, probability=0.25, snr_db=(0, 10), seed=3)
    again = augment.WaveformAugment.from_config(layer.get_config())
    assert again.augmentations == ["speed", "noise"] and again.get_config() == layer.get_config()
    with pytest.raises(ValueError, match="unknown augmentations"):
        augment.WaveformAugment(["echo"])


# --- log-mel features: VTLP and SpecAugment ------------------------------------------------------

def test_slaney_hz_to_mel_is_librosas():
    hz = np.array([0.0, 120.0, 999.0, 1000.0, 1001.0, 3000.0, 8000.0], np.float32)
    # float32 logarithms: agreement to about 1e-6 relative
    np.testing.assert_allclose(augment.slaney_hz_to_mel(hz).numpy(), librosa.hz_to_mel(hz), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("factor", [0.9, 1.0, 1.1])
def test_vtlp_reads_each_band_at_its_centre_over_the_factor_as_numpy_interpolation_does(factor):
    bands, fmax = 40, 8000.0
    centres = librosa.mel_frequencies(bands + 2, fmin=0.0, fmax=fmax)[1:-1]
    smooth = np.sin(centres / 700.0) + centres / 4000.0  # features that are a function of the band's centre
    features = np.tile(smooth[None, None, :], (1, 3, 1)).astype(np.float32)
    features[0, 2] = 0.0  # a padded frame
    warped = augment.warp_mel_bands(tf.constant(features), tf.constant([factor]), 0.0, fmax).numpy()
    # NumPy: linear interpolation between bands on librosa's mel scale, clamped at the first and last band
    expected = np.interp(librosa.hz_to_mel(centres / factor), librosa.hz_to_mel(centres), smooth)
    # float32 mel conversions move a source position by about 1e-5 of a band
    np.testing.assert_allclose(warped[0, 0], expected, atol=1e-4)
    np.testing.assert_array_equal(warped[0, 2], 0.0)
    if factor == 1.1:  # the envelope moves up: each band reads a lower frequency, the first one clamped
        assert warped[0, 0, 0] == pytest.approx(smooth[0], abs=1e-5) and (warped[0, 0, 1:] < smooth[1:]).any()
    if factor == 0.9:  # down: the top bands read above the last centre, clamped to it
        assert warped[0, 0, -1] == warped[0, 0, -2] == pytest.approx(smooth[-1], abs=1e-5)


def test_masks_zero_exactly_the_drawn_spans():
    rng = np.random.default_rng(5)
    features = rng.standard_normal((2, 12, 6)).astype(np.float32) + 3.0  # no zero by chance
    start, width = np.array([[1, 7], [0, 0]], np.int32), np.array([[2, 3], [0, 4]], np.int32)
    for axis in (1, 2):
        out = augment.mask_spans(tf.constant(features), tf.constant(start), tf.constant(width), axis).numpy()
        expected = features.copy()
        for row in range(2):
            for s, w in zip(start[row], width[row]):
                index = [row, slice(None), slice(None)]
                index[axis] = slice(s, s + w)
                expected[tuple(index)] = 0.0
        np.testing.assert_array_equal(out, expected)


def test_feature_augment_is_seeded_bounded_and_the_identity_outside_training():
    rng = np.random.default_rng(6)
    frames = np.array([100, 60, 30, 200], np.int32)
    features = rng.standard_normal((4, 200, 40)).astype(np.float32) + 5.0
    features[np.arange(200)[None, :] >= frames[:, None]] = 0.0

    def run(seed: int, names: list[str]) -> np.ndarray:
        layer = augment.FeatureAugment(names, fmax=8000.0, seed=seed)
        return layer(tf.constant(features), tf.constant(frames), training=True).numpy()

    first, again, other = run(7, ["specaugment"]), run(7, ["specaugment"]), run(8, ["specaugment"])
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    masked_bands = (first == 0).all(axis=1) & (features != 0).any(axis=1)  # [batch, bands]
    masked_frames = (first == 0).all(axis=2) & (features != 0).any(axis=2)  # [batch, frames]
    assert masked_bands.sum(axis=1).max() <= 2 * int(27 / 80 * 40)  # two spans of up to 13 bands
    for row, n in enumerate(frames):  # two spans of up to 10 % of the valid frames, within them
        assert masked_frames[row].sum() <= 2 * min(40, int(0.1 * n))
        assert not masked_frames[row, n:].any()
    warped = run(7, ["vtlp"])
    np.testing.assert_array_equal(warped[features == 0], 0.0)  # padded frames stay padding
    layer = augment.FeatureAugment(fmax=8000.0, seed=7)
    np.testing.assert_array_equal(layer(tf.constant(features), tf.constant(frames), training=False).numpy(),
                                  features)
    again = augment.FeatureAugment.from_config(layer.get_config())
    assert again.get_config() == layer.get_config()
    with pytest.raises(ValueError, match="unknown augmentations"):
        augment.FeatureAugment(["speed"])
