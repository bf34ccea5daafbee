"""What a logit bias costs the output layer's training step: softmax against B-NCE, per noise scope.

A probe behind docs/results.md (issue 27 item 1), not library code. It times the forward pass and the
gradients of ``BatchNCE.training_loss`` alone, at translation's default sizes, with a bias of one of
three kinds:

- "dense bias": a random dense ``[B, T, V]`` tensor standing in for the lexicon's; its gradient is taken,
  as the lexicon's attention takes it in the pipeline. "Uncentred" swaps ``noise_centred_bias`` for the
  identity, which is the code before the centring.
- "lexicon, dense": a ``LexiconBias`` with a random top-k table under random attention, called for its dense
  bias (``mixture=False``, the code before the column path); the gradient goes into the attention.
- "lexicon, columns": the same lexicon's mixture (``mixture=True``), which B-NCE evaluates at its columns
  only and centres without ``V``; the softmax densifies it.

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
from seqapps.layers.lexicon import LexiconBias

BATCH, STEPS, HIDDEN, VOCAB = 64, 31, 256, 9178
SOURCE_STEPS, SOURCE_VOCAB, TOP_K = 31, 7000, 10
REPEATS = 5


def random_lexicon(rng: np.random.Generator) -> tuple[LexiconBias, dict[str, tf.Tensor]]:
    """A lexicon of Zipf-distributed target words and the inputs of one batch (attention as the source)."""
    zipf = 1.0 / np.arange(1, VOCAB + 1)
    lexicon = LexiconBias(SOURCE_VOCAB, VOCAB, TOP_K)
    lexicon.build(None)
    ids = np.stack([rng.choice(VOCAB, TOP_K, replace=False, p=zipf / zipf.sum()) for _ in range(SOURCE_VOCAB)])
    lexicon.set_table(ids, rng.dirichlet(np.ones(TOP_K + 1), SOURCE_VOCAB)[:, :TOP_K])
    attention = rng.dirichlet(np.ones(SOURCE_STEPS), (BATCH, STEPS)).astype("float32")
    return lexicon, {"attention": tf.constant(attention),
                     "source_ids": tf.constant(rng.integers(0, SOURCE_VOCAB, (BATCH, SOURCE_STEPS)), tf.int32)}


def median_step_seconds(loss: str, scope: str, bias_kind: str | None, centred: bool) -> float:
    """The median wall seconds of one output-layer step (loss, gradients w.r.t. inputs, bias and weights).

    Args:
        loss: the layer's ``loss``.
        scope: its ``noise_scope``.
        bias_kind: None, "dense", "lexicon" (its dense bias) or "mixture" (its mixture).
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
    lexicon, lexicon_inputs = random_lexicon(np.random.default_rng(1))
    dense = tf.constant(np.log(np.random.default_rng(1).dirichlet(np.full(VOCAB, 0.01), (BATCH, STEPS)) + 1e-3)
                        .astype("float32"))
    sources = [hidden] + {None: [], "dense": [dense]}.get(bias_kind, [lexicon_inputs["attention"]])

    @tf.function
    def step() -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch(sources)
            if bias_kind in ("lexicon", "mixture"):
                bias = lexicon(lexicon_inputs, mixture=bias_kind == "mixture")
            else:
                bias = dense if bias_kind == "dense" else None
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
    labels = {None: "no bias", "dense": "dense bias", "lexicon": "lexicon, dense", "mixture": "lexicon, columns"}
    cases = [("softmax", "time_step", kind, False) for kind in (None, "dense", "lexicon", "mixture")]
    for scope in ("time_step", "batch"):
        cases += [("bnce", scope, None, False), ("bnce", scope, "dense", False), ("bnce", scope, "dense", True),
                  ("bnce", scope, "lexicon", True), ("bnce", scope, "mixture", True)]
    for loss, scope, kind, centred in cases:
        label = labels[kind] + (", centred" if kind == "dense" and centred else "")
        print(f"{loss:8s} {scope:10s} {label:20s} {1000 * median_step_seconds(loss, scope, kind, centred):6.0f} ms",
              flush=True)


if __name__ == "__main__":
    main()
