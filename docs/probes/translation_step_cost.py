"""What padding and repeated words cost a translation training step: softmax against B-NCE, with and without ``compact_batch``.

A probe behind docs/results.md (issue 27 item 1), not library code. It builds the ``translation`` default preset
(batch-wide B-NCE noise) four times on the same data, as the softmax and as B-NCE, each with ``compact_batch`` off
(every padded row reaches the output layer; B-NCE scores the ``N x N`` columns) and on (real rows only; B-NCE on
the batch's distinct words), and times the same 10 training batches on each in turn, three rounds, so that the
ratios are taken under one load.

Usage::

    python docs/probes/translation_step_cost.py [key=value ...]   # e.g. min_count=1
"""
from __future__ import annotations

import sys
import time

import numpy as np

from pipelines import translation
from seqapps.config import resolve_config
from seqapps.training import make_optimizer

ROUNDS, STEPS = 3, 10
VARIANTS = (("softmax", "softmax", False), ("softmax, compact", "softmax", True),
            ("B-NCE", "bnce", False), ("B-NCE, compact", "bnce", True))


def main(overrides: list[str]) -> None:
    """Prints each variant's median seconds per step, tokens/s and ratios to both softmax variants."""
    overrides = ["noise_scope=batch", *overrides]
    pipeline = translation.Translation()
    config = resolve_config(translation.TranslationConfig, "default", overrides=overrides)
    data = pipeline.load_data(config, None)
    weights = np.concatenate([w.numpy() for _, _, w in data.train.batch(4096)])
    print(f"target words {len(data.state['target_vocabulary'])}, real target tokens per row "
          f"{weights.sum(1).mean():.2f} of {weights.shape[1]}")
    batches = list(data.train.shuffle(10_000, seed=0).batch(config.batch_size, drop_remainder=True).take(STEPS + 1))
    tokens = sum(float(batch[2].numpy().sum()) for batch in batches[1:])
    models = {}
    for name, output, compact in VARIANTS:
        variant = resolve_config(translation.TranslationConfig, "default", overrides=[*overrides, f"output={output}"])
        model = pipeline.build_model(variant, data)
        model.get_layer("output").compact_batch = compact
        model.compile(optimizer=make_optimizer(variant), **pipeline.compile_args(variant, data))
        model.train_on_batch(*batches[0])  # trace
        models[name] = model
    seconds: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(ROUNDS):
        for name, model in models.items():
            start = time.perf_counter()
            for batch in batches[1:]:
                model.train_on_batch(*batch)
            seconds[name].append(time.perf_counter() - start)
    median = {name: float(np.median(times)) for name, times in seconds.items()}
    for name in models:
        print(f"{name}: {median[name] / STEPS:.4f} s/step, {tokens / median[name]:.0f} tokens/s, "
              f"{median['softmax'] / median[name]:.2f}x the softmax, "
              f"{median['softmax, compact'] / median[name]:.2f}x the compact softmax")


if __name__ == "__main__":
    main(sys.argv[1:])
