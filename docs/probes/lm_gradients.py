"""How well each sampled loss's gradient points where the softmax's does, in the language model at its start.

A probe behind docs/results.md (issue 27 item 3), not library code. It builds the ``language_model`` default
(lstm_relu, WordNet glosses, B=400 windows of 20 words) once, copies the same starting weights into one model
per loss, and takes the gradient of each loss on the same training batches (shuffled windows, as in training). For every weight it prints the
gradient's norm and its cosine with the softmax's gradient (the maximum-likelihood direction that NCE
estimates), averaged over the batches.

Usage::

    python docs/probes/lm_gradients.py [BATCHES]
"""
from __future__ import annotations

import sys

import keras
import numpy as np
import tensorflow as tf

from pipelines.language_model import LanguageModel, LanguageModelConfig
from seqapps.config import resolve_config

CASES = (("softmax", "time_step"), ("bnce", "time_step"), ("bnce", "batch"), ("snce", "time_step"))


def gradients(model: keras.Model, inputs: dict) -> dict[str, np.ndarray]:
    """Each trainable weight's gradient of the mean per-token loss, dense."""
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(inputs, training=True))
    found = tape.gradient(loss, model.trainable_weights)
    return {weight.path: tf.convert_to_tensor(grad).numpy() for weight, grad in zip(model.trainable_weights, found)}


def main(batches: int) -> None:
    pipeline = LanguageModel()
    base = resolve_config(LanguageModelConfig, "default")
    data = pipeline.load_data(base, None)
    models = {}
    for loss, scope in CASES:
        config = resolve_config(LanguageModelConfig, "default", overrides=[f"loss={loss}", f"noise_scope={scope}"])
        models[(loss, scope)] = pipeline.build_model(config, data)
    start = models[CASES[0]].get_weights()
    for model in models.values():
        model.set_weights(start)
    sums: dict[tuple, dict[str, list[float]]] = {case: {} for case in CASES}
    for inputs, _ in data.train.shuffle(200_000, seed=0).batch(base.batch_size).take(batches):
        found = {case: gradients(model, inputs) for case, model in models.items()}
        for case in CASES:
            for name, grad in found[case].items():
                reference = found[CASES[0]][name].ravel()
                cosine = float(grad.ravel() @ reference / (np.linalg.norm(grad) * np.linalg.norm(reference) + 1e-30))
                sums[case].setdefault(name, []).append((float(np.linalg.norm(grad)), cosine))
    for case in CASES:
        for name, values in sums[case].items():
            norm, cosine = np.mean(values, axis=0)
            print(f"{case[0]:8s} {case[1]:10s} {name:32s} norm {norm:10.3e}  cosine with softmax {cosine:+.3f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
