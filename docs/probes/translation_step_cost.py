"""What padding and repeated words cost a translation training step: softmax against B-NCE, with and without
``compact_batch``, on full-width batches and on the batches training makes.

A probe behind docs/results.md (issue 27 item 1), not library code. It builds the ``translation`` default preset
(batch-wide B-NCE noise) four times on the same data, as the softmax and as B-NCE, each with ``compact_batch`` off
(every padded row reaches the output layer; B-NCE scores the ``N x N`` columns) and on (real rows only; B-NCE on
the batch's distinct words). It times 10 training batches two ways on each model in turn, three rounds, so that
the ratios are taken under one load: "full width" (shuffled pairs padded to ``max_length``, the batches training
made before pairs were cut to their own length) and "as trained" (the first batches of ``batch_datasets``: padded
to the batch's longest pair, and of pairs of similar length with ``length_sorted_batches=32``).

Usage::

    python docs/probes/translation_step_cost.py [key=value ...]   # e.g. min_count=1 length_sorted_batches=32
"""
from __future__ import annotations

import sys
import time

import numpy as np

from pipelines import translation
from seqapps.config import resolve_config
from seqapps.training import batch_datasets, make_optimizer

ROUNDS, STEPS = 3, 10
VARIANTS = (("softmax", "softmax", False), ("softmax, compact", "softmax", True),
            ("B-NCE", "bnce", False), ("B-NCE, compact", "bnce", True))


def main(overrides: list[str]) -> None:
    """Prints each variant's median seconds per step, tokens/s and ratios to both softmax variants."""
    overrides = ["noise_scope=batch", *overrides]
    pipeline = translation.Translation()
    config = resolve_config(translation.TranslationConfig, "default", overrides=overrides)
    data = pipeline.load_data(config, None)
    widths = {"source": config.max_length, "target_in": config.max_length + 1, "target_out": config.max_length + 1}
    full_width = data.train.shuffle(10_000, seed=0).padded_batch(
        config.batch_size, padded_shapes=(widths, [widths["target_in"]], [widths["target_in"]]),
        padding_values=data.padding_values, drop_remainder=True)
    batchings = {"full width": list(full_width.take(STEPS + 1)),
                 "as trained": list(batch_datasets(data, config)[0].take(STEPS + 1))}
    print(f"target words {len(data.state['target_vocabulary'])}")
    tokens = {}
    for way, batches in batchings.items():
        tokens[way] = sum(float(batch[2].numpy().sum()) for batch in batches[1:])
        print(f"{way}: real target tokens per row {tokens[way] / STEPS / config.batch_size:.2f} of "
              f"{np.mean([batch[2].shape[1] for batch in batches[1:]]):.1f} columns on average")
    models = {}
    for name, output, compact in VARIANTS:
        variant = resolve_config(translation.TranslationConfig, "default", overrides=[*overrides, f"output={output}"])
        model = pipeline.build_model(variant, data)
        model.get_layer("output").compact_batch = compact
        model.compile(optimizer=make_optimizer(variant), **pipeline.compile_args(variant, data))
        for batches in batchings.values():  # an untimed round: traces every batch shape
            for batch in batches:
                model.train_on_batch(*batch)
        models[name] = model
    seconds = {(name, way): [] for name in models for way in batchings}
    for _ in range(ROUNDS):
        for name, model in models.items():
            for way, batches in batchings.items():
                start = time.perf_counter()
                for batch in batches[1:]:
                    model.train_on_batch(*batch)
                seconds[name, way].append(time.perf_counter() - start)
    median = {key: float(np.median(times)) for key, times in seconds.items()}
    baseline = median["softmax, compact", "full width"]
    for way in batchings:
        for name in models:
            print(f"{way}, {name}: {median[name, way] / STEPS:.4f} s/step, {tokens[way] / median[name, way]:.0f} "
                  f"tokens/s, {median['softmax, compact', way] / median[name, way]:.2f}x the compact softmax on the "
                  f"same batches, {tokens[way] / median[name, way] / (tokens['full width'] / baseline):.2f}x its "
                  f"tokens/s on full-width batches")

if __name__ == "__main__":
    main(sys.argv[1:])
