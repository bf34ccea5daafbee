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
