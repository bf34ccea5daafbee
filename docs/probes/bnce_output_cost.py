"""What a dense logit bias costs the output layer's training step: softmax against B-NCE, per noise scope.

A probe behind docs/results.md (issue 27 item 1), not library code. It times the forward pass and the
gradients of ``BatchNCE.training_loss`` alone, at translation's default sizes, with a random dense
``[B, T, V]`` bias standing in for the lexicon's. The bias's gradient is taken too, as the lexicon's
attention takes it in the pipeline. "Uncentred" swaps ``noise_centred_bias`` for the identity, which is
the code before the centring.

Usage::

    python docs/probes/bnce_output_cost.py
"""
from __future__ import annotations

import time
from unittest import mock

import numpy as np
import tensorflow as tf

from seqapps.layers import batch_nce
from seqapps.layers.batch_nce import BatchNCE, unigram_distribution

BATCH, STEPS, HIDDEN, VOCAB = 64, 31, 256, 9178
REPEATS = 5


def median_step_seconds(loss: str, scope: str, bias: tf.Tensor | None, centred: bool) -> float:
    """The median wall seconds of one output-layer step (loss, gradients w.r.t. inputs, bias and weights).

    Args:
        loss: the layer's ``loss``.
        scope: its ``noise_scope``.
        bias: the dense logit bias, or None for none.
        centred: keep ``noise_centred_bias``; False replaces it by the identity.
    """
    rng = np.random.default_rng(0)
    zipf = 1.0 / np.arange(1, VOCAB + 1)
    hidden = tf.constant(rng.normal(0, 0.3, (BATCH, STEPS, HIDDEN)).astype("float32"))
    targets = tf.constant(rng.choice(VOCAB, (BATCH, STEPS), p=zipf / zipf.sum()).astype("int32"))
    mask = tf.constant(np.arange(STEPS)[None, :] < rng.integers(10, STEPS, (BATCH, 1)))
    layer = BatchNCE(VOCAB, loss=loss, noise_scope=scope, seed=0)
    layer.build((None, None, HIDDEN))
    layer.set_noise_distribution(unigram_distribution(1000 * zipf))
    sources = [hidden] if bias is None else [hidden, bias]

    @tf.function
    def step() -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch(sources)
            total = tf.reduce_sum(layer.training_loss(hidden, targets, bias, mask))
        return tape.gradient(total, [*sources, layer.kernel, layer.bias])

    identity = mock.patch.object(batch_nce, "noise_centred_bias", lambda values, probs: values)
    with (mock.MagicMock() if centred else identity):
        step()  # trace
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    return float(np.median(times))


def main() -> None:
    rng = np.random.default_rng(1)
    bias = tf.constant(np.log(rng.dirichlet(np.full(VOCAB, 0.01), (BATCH, STEPS)) + 1e-3).astype("float32"))
    cases = [("softmax", "time_step", None, False), ("softmax", "time_step", bias, False)]
    for scope in ("time_step", "batch"):
        cases += [("bnce", scope, None, False), ("bnce", scope, bias, False), ("bnce", scope, bias, True)]
    for loss, scope, case_bias, centred in cases:
        label = "no bias" if case_bias is None else ("dense bias, centred" if centred else "dense bias")
        print(f"{loss:8s} {scope:10s} {label:20s} {1000 * median_step_seconds(loss, scope, case_bias, centred):6.0f} ms",
              flush=True)


if __name__ == "__main__":
    main()
