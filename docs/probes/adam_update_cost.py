"""What Adam's update costs in a pipeline's training step: Keras' elementwise update against the fused kernel.

A probe behind docs/results.md ("Adam's update in one kernel"), not library code. It builds the pipeline's
``default`` preset twice, once with ``keras.optimizers.Adam.update_step`` and once with
``seqapps.training.Adam``'s fused ``ResourceApplyAdam``, and times the same 10 training batches (the pipeline's
own first batches) on each in turn, five rounds, so that the ratio is taken under one load.

Usage::

    python docs/probes/adam_update_cost.py PIPELINE [key=value ...]   # e.g. translation min_count=1
"""
from __future__ import annotations

import sys
import time

import keras
import numpy as np

from seqapps import training
from seqapps.config import resolve_config
from seqapps.pipeline import REGISTRY
from seqapps.training import batch_datasets, make_optimizer

ROUNDS, STEPS = 5, 10


def main(name: str, overrides: list[str]) -> None:
    """Prints the median seconds per step with each update and their ratio."""
    pipeline = REGISTRY.get(name)()
    config = resolve_config(pipeline.Config, "default", overrides=overrides)
    data = pipeline.load_data(config, None)
    train, _, _ = batch_datasets(data, config)
    batches = list(train.take(STEPS + 1))
    fused_update = training.Adam.update_step
    models = {}
    try:
        for variant, update in (("keras", keras.optimizers.Adam.update_step), ("fused", fused_update)):
            training.Adam.update_step = update  # read when the step is traced, just below
            model = pipeline.build_model(config, data)
            model.compile(optimizer=make_optimizer(config), **pipeline.compile_args(config, data))
            model.train_on_batch(*batches[0])
            models[variant] = model
    finally:
        training.Adam.update_step = fused_update
    seconds: dict[str, list[float]] = {variant: [] for variant in models}
    for _ in range(ROUNDS):
        for variant, model in models.items():
            start = time.perf_counter()
            for batch in batches[1:]:
                model.train_on_batch(*batch)
            seconds[variant].append(time.perf_counter() - start)
    median = {variant: float(np.median(times)) / STEPS for variant, times in seconds.items()}
    print(f"{name} {overrides} ({config.optimizer}): Keras' update {median['keras']:.4f} s/step, "
          f"fused {median['fused']:.4f} s/step, fused is {median['keras'] / median['fused']:.3f}x as fast")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
