"""What a speech training step costs as the BiGRU widens or deepens.

A probe behind docs/results.md ("A larger model, a wider warp, and espeak-ng alone again"), not library code. It
builds the ``speech_recognition`` default preset's model with the given overrides and times its ``train_step``
(log-mel, encoder, CTC loss, gradients, Adam) on one batch of 16 random 4-second clips with 50-character
transcripts: 3 warm-up steps, then the mean of 15. Run it once per size, one after the other, so that the sizes
are timed under one load.

Usage::

    python docs/probes/speech_model_sizes.py 'units=[256,256]' [key=value ...]
"""
from __future__ import annotations

import json
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from seqapps import training
from seqapps.config import resolve_config
from seqapps.data import speech
from seqapps.pipeline import REGISTRY, Splits

BATCH, SECONDS, CHARACTERS, WARM_UP, TIMED = 16, 4, 50, 3, 15


def main(overrides: list[str]) -> None:
    """Prints the overrides, the mean seconds per training step and the parameter count as one JSON line."""
    keras.utils.set_random_seed(0)
    pipeline = REGISTRY.get("speech_recognition")()
    config = resolve_config(pipeline.Config, "default", overrides=overrides)
    chars = ["", *sorted(set(speech.SPOKEN_CHARS))]
    state = {"chars": chars, "sample_rate": speech.SAMPLE_RATE}
    model = training.build_and_compile(pipeline, config, Splits(None, None, None, state=state),
                                       tf.distribute.get_strategy())
    rng = np.random.default_rng(0)
    samples = SECONDS * speech.SAMPLE_RATE
    inputs = {"waveform": tf.constant(rng.normal(0, 0.1, (BATCH, samples)).astype(np.float32)),
              "length": tf.constant([samples] * BATCH, tf.int32)}
    labels = tf.constant(rng.integers(1, len(chars), (BATCH, CHARACTERS)), tf.int32)
    step = tf.function(lambda inputs, labels: model.train_step((inputs, labels))["loss"])
    for _ in range(WARM_UP):
        step(inputs, labels).numpy()
    start = time.perf_counter()
    for _ in range(TIMED):
        step(inputs, labels).numpy()
    print(json.dumps({"overrides": overrides, "step_s": round((time.perf_counter() - start) / TIMED, 4),
                      "parameters": model.count_params()}))


if __name__ == "__main__":
    main(sys.argv[1:])
