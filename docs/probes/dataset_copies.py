"""How many copies of its audio a ``tf.data`` dataset of clips holds, by how the dataset is made.

A probe behind docs/results.md ("Memory of the speech default"), not library code. Each way runs in a fresh
process on 1 GiB of int16 samples (8,000 clips of 64,000), and prints the resident memory over the process's
start after the dataset is made and after one pass over it. Freed heap is returned to the system (``malloc_trim``)
before each reading, so the figures count live memory.

- ``ragged``: ``from_tensor_slices`` of a ``RaggedTensor`` (the speech pipeline until this probe);
- ``captured``: a dataset of indices whose function slices a captured ``tf.constant`` (``window_dataset`` until now);
- ``variable``: the same, slicing a ``tf.Variable`` (``seqapps.data.audio.shared_samples``, now both).

Usage::

    python docs/probes/dataset_copies.py
"""
from __future__ import annotations

import ctypes
import gc
import subprocess
import sys

import numpy as np

CLIPS, SAMPLES = 8000, 64000
WAYS = ("ragged", "captured", "variable")


def resident_gib() -> float:
    """This process's resident memory in GiB, after returning freed heap to the system."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2 ** 30


def measure(way: str) -> None:
    """Prints the memory over the start after making the dataset, and after one pass over it."""
    import tensorflow as tf

    start = resident_gib()
    lengths = np.full(CLIPS, SAMPLES, np.int64)
    starts = np.cumsum(lengths) - lengths
    samples = np.ones(CLIPS * SAMPLES, np.int16)
    if way == "ragged":
        dataset = tf.data.Dataset.from_tensor_slices(tf.RaggedTensor.from_row_lengths(samples, lengths))
    else:
        held = tf.constant(samples) if way == "captured" else tf.Variable(samples, trainable=False)
        dataset = tf.data.Dataset.from_tensor_slices((starts, lengths)).map(
            lambda first, length: held[first:first + length])
    del samples
    made = resident_gib() - start
    for _ in dataset:
        pass
    print(f"{way}: {made:.2f} GiB after making the dataset, {resident_gib() - start:.2f} GiB after a pass "
          f"({CLIPS * SAMPLES * 2 / 2 ** 30:.2f} GiB of samples)", flush=True)


def main() -> None:
    """Runs each way in its own process."""
    for way in WAYS:
        subprocess.run([sys.executable, __file__, way], check=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        measure(sys.argv[1])
    else:
        main()
