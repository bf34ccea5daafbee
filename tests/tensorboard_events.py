"""Reads the TensorBoard event files a run wrote, as TensorBoard would (``tf.compat.v1.train.summary_iterator``)."""
from __future__ import annotations

from pathlib import Path

import tensorflow as tf


def read_events(folder: str | Path) -> dict[str, dict[int, list[tf.compat.v1.Summary.Value]]]:
    """Every summary value in the event files of one folder (``run/train``, ``run/test``), by tag and step.

    Args:
        folder: a folder of ``events.out.tfevents.*`` files; a resumed run leaves several, read in order.

    Returns:
        ``{tag: {step: [value, ...]}}``: more than one value at a step means it was logged twice.
    """
    found: dict[str, dict[int, list[tf.compat.v1.Summary.Value]]] = {}
    for path in sorted(Path(folder).glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                found.setdefault(value.tag, {}).setdefault(event.step, []).append(value)
    return found


def scalars(folder: str | Path, tag: str) -> dict[int, float]:
    """The scalar ``tag`` of a folder's events by step (Keras' callback and ``tf.summary.scalar`` write tensors).

    Raises:
        AssertionError: a step holds the tag twice.
    """
    by_step = read_events(folder).get(tag, {})
    assert all(len(values) == 1 for values in by_step.values()), f"{tag} logged twice at a step: {by_step}"
    return {step: float(tf.make_ndarray(values[0].tensor)) for step, values in sorted(by_step.items())}
