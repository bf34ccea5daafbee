"""What a speech training step costs per utterance, by batch size and by how clips are grouped into batches.

A probe behind docs/results.md ("Throughput of the speech default"), not library code. It loads the
``speech_recognition`` default preset's corpus and times training steps of its model on the same 1,024 training
clips batched four ways: shuffled batches of 16 and 32, and batches of 16 and 32 grouped by length
(``seqapps.training.length_grouped_batches``, windows of ``WINDOW_BATCHES`` batches). Each way runs in turn,
three rounds, so that the ratios are taken under one load. It also prints the share of each way's samples that
are padding.

Usage::

    python docs/probes/speech_batch_cost.py [key=value ...]
"""
from __future__ import annotations

import sys
import time

import numpy as np
import tensorflow as tf

from pipelines import speech_recognition
from seqapps.config import resolve_config
from seqapps.training import length_grouped_batches, make_optimizer

CLIPS, ROUNDS, WINDOW_BATCHES = 1024, 3, 32


def main(overrides: list[str]) -> None:
    """Prints seconds per utterance, steps per second and the padding share of each way of batching."""
    pipeline = speech_recognition.SpeechRecognition()
    config = resolve_config(speech_recognition.SpeechRecognitionConfig, "default", overrides=overrides)
    data = pipeline.load_data(config, None)
    train = data.train.take(CLIPS).cache()
    ways = {}
    for size in (16, 32):
        ways[f"shuffled {size}"] = train.shuffle(CLIPS, seed=1).padded_batch(size)
        ways[f"grouped by length {size}"] = length_grouped_batches(train.shuffle(CLIPS, seed=1), size,
                                                                   WINDOW_BATCHES, seed=1)
    batches = {way: list(dataset) for way, dataset in ways.items()}
    models = {}
    for way, held in batches.items():
        frames = sum(int(tf.size(inputs["waveform"])) for inputs, _ in held)
        real = sum(int(tf.reduce_sum(inputs["length"])) for inputs, _ in held)
        print(f"{way}: {len(held)} batches, padding {1 - real / frames:.1%} of the samples", flush=True)
        model = pipeline.build_model(config, data)
        model.compile(optimizer=make_optimizer(config), **pipeline.compile_args(config, data))
        for batch in held[:3]:  # trace the shapes' first variants
            model.train_on_batch(*batch)
        models[way] = model
    seconds: dict[str, list[float]] = {way: [] for way in batches}
    for _ in range(ROUNDS):
        for way, held in batches.items():
            start = time.perf_counter()
            for batch in held:
                models[way].train_on_batch(*batch)
            seconds[way].append(time.perf_counter() - start)
    base = float(np.median(seconds["shuffled 16"]))
    for way, times in seconds.items():
        median = float(np.median(times))
        steps = len(batches[way])
        print(f"{way}: {median / steps:.3f} s/step, {1000 * median / (steps * int(way.split()[-1])):.1f} ms per "
              f"utterance, {base / median:.2f}x the utterances/s of shuffled 16 (rounds: "
              f"{', '.join(f'{t:.1f}' for t in times)} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
