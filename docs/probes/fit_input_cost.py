"""Whether a translation training step inside ``fit`` waits on its input: tf.data batches against held batches.

A probe behind docs/results.md ("Adam's update in one kernel, and ``min_count=1`` on another machine"), not
library code. It builds the ``translation`` default preset (batch-wide B-NCE noise, ``min_count=1`` unless
overridden) and, in two rounds, times 40 steps three ways: ``fit`` on the pipeline's own tf.data batches,
``train_on_batch`` over the same batches held in memory, and ``fit`` on those held batches.

Usage::

    python docs/probes/fit_input_cost.py [key=value ...]
"""
from __future__ import annotations

import sys
import time

import tensorflow as tf

from pipelines import translation
from seqapps.config import resolve_config
from seqapps.training import batch_datasets, make_optimizer

STEPS, TRACE = 40, 5


def main(overrides: list[str]) -> None:
    """Prints seconds per step for each of the three ways, per round."""
    overrides = ["output=bnce", "noise_scope=batch", "min_count=1", *overrides]
    pipeline = translation.Translation()
    config = resolve_config(translation.TranslationConfig, "default", overrides=overrides)
    data = pipeline.load_data(config, None)
    train, _, _ = batch_datasets(data, config)
    held = list(train.skip(TRACE).take(STEPS))
    model = pipeline.build_model(config, data)
    model.compile(optimizer=make_optimizer(config), **pipeline.compile_args(config, data))
    model.fit(train.take(TRACE), verbose=0)  # trace
    for round_index in range(2):
        start = time.perf_counter()
        model.fit(train.skip(TRACE).take(STEPS), verbose=0)
        from_tf_data = (time.perf_counter() - start) / STEPS
        start = time.perf_counter()
        for batch in held:
            model.train_on_batch(*batch)
        one_by_one = (time.perf_counter() - start) / STEPS
        in_memory = tf.data.Dataset.from_generator(lambda: iter(held), output_signature=train.element_spec)
        start = time.perf_counter()
        model.fit(in_memory, verbose=0)
        from_memory = (time.perf_counter() - start) / STEPS
        print(f"round {round_index}: fit on tf.data {from_tf_data:.4f} s/step, train_on_batch on held batches "
              f"{one_by_one:.4f}, fit on held batches {from_memory:.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
