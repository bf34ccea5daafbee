"""One training loop for every pipeline.

It is ``keras.Model.fit`` with the callbacks every run needs: early stopping on
validation loss (best weights restored), the learning rate halved on plateau,
global gradient-norm clipping, a NaN guard that stops with an error, and
``BackupAndRestore`` checkpoints so that a killed run resumes where it stopped.
Models are built under the chosen ``tf.distribute`` strategy; with several workers,
the chief keeps the backup that every worker resumes from.
"""
from __future__ import annotations

import functools
import json
import math
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import keras
import tensorflow as tf

from seqapps.config import TrainingConfig
from seqapps.errors import ConfigError, TrainingError
from seqapps.pipeline import Pipeline, Splits

STRATEGIES = ("auto", "mirrored", "multiworker")


@functools.cache
def make_strategy(name: str) -> tf.distribute.Strategy:
    """Returns the distribution strategy for ``--strategy``.

    Args:
        name: "auto" (the default strategy: one device), "mirrored" (all local
            GPUs; without GPUs, every logical CPU device) or "multiworker"
            (MultiWorkerMirroredStrategy configured from the ``TF_CONFIG``
            environment variable).

    Returns:
        The strategy; create it before any other TensorFlow work. One process gets one
        strategy of each name: a second MirroredStrategy in the same process would reuse
        the first one's collective keys and abort with a shape mismatch.
    """
    if name == "auto":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
        return tf.distribute.MirroredStrategy([device.name for device in devices])
    if name == "multiworker":
        if "TF_CONFIG" not in os.environ:
            raise ConfigError("--strategy multiworker needs the TF_CONFIG environment variable "
                              '(e.g. {"cluster": {"worker": [...]}, "task": {"type": "worker", "index": 0}})')
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise ConfigError(f"--strategy {name!r}: choose one of {', '.join(STRATEGIES)}")


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True on the worker that writes exports (always true without multiworker)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return True
    return resolver.task_type in ("chief", None) or (
        resolver.task_type == "worker" and resolver.task_id == 0 and "chief" not in resolver.cluster_spec().jobs)


def is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
    """True under MultiWorkerMirroredStrategy with more than one training task in TF_CONFIG."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    spec = strategy.cluster_resolver.cluster_spec()
    return sum(spec.num_tasks(job) for job in spec.jobs if job in ("chief", "worker")) > 1


def worker_checkpoint_dir(checkpoint_dir: Path, strategy: tf.distribute.Strategy) -> Path:
    """The folder this worker's ``BackupAndRestore`` writes.

    Keras 3's ``BackupAndRestore`` knows nothing of workers, so two workers writing one
    folder would race. The chief keeps ``checkpoint_dir``; every other worker writes a
    sibling folder of its own and, before training, starts from a copy of the chief's
    backup, so that all workers resume from the same epoch after a restart.

    Args:
        checkpoint_dir: the run's backup folder (on a file system all workers share).
        strategy: the run's strategy.

    Returns:
        The folder to hand to ``BackupAndRestore``.
    """
    if is_chief(strategy):
        return checkpoint_dir
    resolver = strategy.cluster_resolver
    own = checkpoint_dir.with_name(f"{checkpoint_dir.name}-{resolver.task_type}-{resolver.task_id}")
    shutil.rmtree(own, ignore_errors=True)
    if checkpoint_dir.is_dir():
        # The chief cannot write a newer backup meanwhile: its next one needs this worker's steps.
        shutil.copytree(checkpoint_dir, own)
    return own


def sum_duplicate_rows(grad: Any) -> Any:
    """An ``IndexedSlices`` gradient with the rows of each index summed (other gradients unchanged).

    Sorting keeps every shape static, so this runs under XLA (``tf.unique`` would not): the
    result has as many rows as ``grad``, the sums first, then zero rows.

    Args:
        grad: a tensor, ``tf.IndexedSlices`` or None.

    Returns:
        ``grad``, or its slices with unique indices apart from zero-valued padding rows.
    """
    if not isinstance(grad, tf.IndexedSlices):
        return grad
    order = tf.argsort(grad.indices)
    ids = tf.gather(grad.indices, order)
    starts = tf.concat([tf.zeros_like(ids[:1]), tf.cast(ids[1:] != ids[:-1], ids.dtype)], 0)
    segments = tf.cumsum(starts)
    rows = tf.shape(ids)[0]
    values = tf.math.unsorted_segment_sum(tf.gather(grad.values, order), segments, rows)
    indices = tf.math.unsorted_segment_max(ids, segments, rows)
    real = tf.range(rows, dtype=ids.dtype) <= segments[-1:]
    indices = tf.where(real, indices, tf.reduce_min(ids))  # zero padding rows: any valid index
    return tf.IndexedSlices(values, indices, grad.dense_shape)


def clip_by_global_norm(grads: Sequence[Any], clip_norm: float) -> list[Any]:
    """Scales ``grads`` so that the norm of the summed (dense-equivalent) gradients is at most ``clip_norm``.

    Unlike Keras' ``global_clipnorm``, an ``IndexedSlices`` gradient with duplicate rows
    (embeddings, ``BatchNCE``) has its duplicates summed first (``sum_duplicate_rows``), so
    the norm, and the clipping, are those of the dense gradient.

    Args:
        grads: tensors, ``tf.IndexedSlices`` or None.
        clip_norm: the largest global norm.

    Returns:
        The scaled gradients (NaN everywhere if the norm is not finite, as in Keras).
    """
    grads = [sum_duplicate_rows(g) for g in grads]
    present = [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads if g is not None]
    if not present:
        return grads
    norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(tf.cast(g, tf.float32))) for g in present]))
    scale = clip_norm * tf.minimum(1.0 / norm, 1.0 / clip_norm) + (norm - norm)

    def scaled(g: Any) -> Any:
        if isinstance(g, tf.IndexedSlices):
            return tf.IndexedSlices(g.values * tf.cast(scale, g.values.dtype), g.indices, g.dense_shape)
        return None if g is None else g * tf.cast(scale, g.dtype)

    return [scaled(g) for g in grads]


class _DenseEquivalentClipping:
    """Optimizer mixin: duplicate sparse rows summed before clipping and the update."""

    def _clip_gradients(self, grads: list) -> list:
        if self.global_clipnorm and self.global_clipnorm > 0:
            return clip_by_global_norm(grads, self.global_clipnorm)
        return super()._clip_gradients([sum_duplicate_rows(g) for g in grads])


@keras.saving.register_keras_serializable(package="seqapps")
class SGD(_DenseEquivalentClipping, keras.optimizers.SGD):
    """``keras.optimizers.SGD`` whose sparse gradients clip and update as their dense sums do."""


@keras.saving.register_keras_serializable(package="seqapps")
class Adam(_DenseEquivalentClipping, keras.optimizers.Adam):
    """``keras.optimizers.Adam`` whose sparse gradients clip and update as their dense sums do.

    Keras' Adam squares each duplicate slice on its own, so without the summing its second
    moment would differ from the dense gradient's.
    """


def make_optimizer(config: TrainingConfig) -> keras.optimizers.Optimizer:
    """Returns the configured optimizer with global gradient-norm clipping (see ``clip_by_global_norm``)."""
    clip = {"global_clipnorm": config.clipnorm} if config.clipnorm > 0 else {}
    if config.optimizer == "sgd":
        return SGD(learning_rate=config.learning_rate, **clip)
    return Adam(learning_rate=config.learning_rate, **clip)


def _adapt_to_distribution(model: keras.Model, train: tf.data.Dataset) -> None:
    """Works around Keras 3.15 ``fit``/``evaluate`` failures under tf.distribute.

    1. Before each ``fit``, ``evaluate`` and ``predict``, Keras averages the first batch
       across replicas with ``strategy.reduce`` to build the model, even when it is
       built. That fails for a batch that splits unevenly (a last, short batch) and,
       across workers, for nested inputs (keras-team/keras#20329). Here the model is
       built once from a local batch, and that step is skipped.
    2. Across workers, Keras averages the step's logs with
       ``strategy.reduce("MEAN", v, axis=0)``, which fails on scalar logs. Here each log
       gets a leading axis of one, so the reduction averages over replicas, and every
       worker sees the same logs (so early stopping and learning-rate decisions agree).

    Args:
        model: a compiled model, built under a strategy with more than one replica.
        train: the batched training dataset (one batch is read to build the model).
    """
    with model.distribute_strategy.scope():
        model._symbolic_build(data_batch=next(iter(train)))
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None
    if not is_multi_worker(model.distribute_strategy):
        return
    for name in ("train_step", "test_step"):
        step = getattr(model, name)
        setattr(model, name, lambda data, step=step: tf.nest.map_structure(lambda v: v[None], step(data)))


class _StopOnNonFiniteLoss(keras.callbacks.Callback):
    """Raises TrainingError as soon as the training loss is NaN or infinite."""

    def __init__(self) -> None:
        super().__init__()
        self.epoch = 0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            self.model.stop_training = True
            raise TrainingError(f"training loss became {float(loss)} at epoch {self.epoch + 1}, step {batch + 1}; "
                                "lower learning_rate or check the data for extreme values")


def batch_datasets(data: Splits, config: TrainingConfig) -> tuple[tf.data.Dataset, tf.data.Dataset]:
    """Shuffles and batches the train split, batches the validation split."""
    train = data.train.shuffle(4096, seed=config.seed, reshuffle_each_iteration=True)
    if config.steps_per_epoch is not None:
        train = train.repeat()
    train = train.batch(config.batch_size).prefetch(tf.data.AUTOTUNE)
    val = data.val.batch(config.batch_size).prefetch(tf.data.AUTOTUNE)
    return train, val


def build_and_compile(pipeline: Pipeline, config: TrainingConfig, data: Splits,
                      strategy: tf.distribute.Strategy,
                      load_model: Callable[[], keras.Model] | None = None) -> keras.Model:
    """Builds (or loads, for fine-tuning) and compiles the model under ``strategy``.

    Args:
        pipeline: supplies the model and its loss.
        config: the resolved config.
        data: the splits the model is built for.
        strategy: the distribution strategy.
        load_model: when given, returns an existing model to continue training.

    Returns:
        A compiled model whose variables live under ``strategy``.
    """
    with strategy.scope():
        model = load_model() if load_model else pipeline.build_model(config, data)
        model.compile(optimizer=make_optimizer(config), **pipeline.compile_args(config, data))
    return model


def fit(model: keras.Model, data: Splits, config: TrainingConfig, checkpoint_dir: Path,
        verbose: bool = False, extra_callbacks: Sequence[keras.callbacks.Callback] = ()) -> dict[str, Any]:
    """Trains ``model`` with the shared callbacks; resumes from ``checkpoint_dir`` if a backup is there.

    Args:
        model: a compiled model.
        data: the train and validation splits (unbatched).
        config: epochs, batch size, patience, seed.
        checkpoint_dir: where BackupAndRestore keeps its backup; it is removed when
            training completes.
        verbose: show Keras' progress bar (for a terminal).
        extra_callbacks: more callbacks, run after the shared ones.

    Returns:
        A JSON-able report: epochs run, training loss per epoch, the epoch resumed
        from, best validation loss, final learning rate and seconds.

    Raises:
        TrainingError: the loss became NaN or infinite, or another worker stopped.
    """
    keras.utils.set_random_seed(config.seed)
    train, val = batch_datasets(data, config)
    strategy = model.distribute_strategy
    checkpoint_dir = worker_checkpoint_dir(Path(checkpoint_dir), strategy)
    if strategy.num_replicas_in_sync > 1:
        _adapt_to_distribution(model, train)
    resumed_from = _backup_epoch(checkpoint_dir)
    callbacks = [
        keras.callbacks.BackupAndRestore(str(checkpoint_dir), double_checkpoint=True, delete_checkpoint=True),
        _StopOnNonFiniteLoss(),
        keras.callbacks.EarlyStopping(monitor="val_loss", patience=config.early_stopping_patience,
                                      restore_best_weights=True),
        keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=config.lr_patience,
                                          min_lr=config.learning_rate / 64),
        *extra_callbacks,
    ]
    start = time.perf_counter()
    try:
        history = model.fit(train, validation_data=val, epochs=config.epochs, steps_per_epoch=config.steps_per_epoch,
                            callbacks=callbacks, shuffle=False, verbose=1 if verbose else 0)
    except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError) as error:
        if not is_multi_worker(strategy):
            raise
        tasks = sorted(set(re.findall(r"/job:\w+/replica:\d+/task:\d+", str(error).partition("unhealthy")[2])))
        raise TrainingError(f"another worker stopped ({type(error).__name__}; unhealthy: {', '.join(tasks) or '?'}); "
                            "start every worker again with the same command to resume from the last backup") from None
    val_losses = [float(v) for v in history.history.get("val_loss", [])]
    return {
        "epochs_run": len(history.epoch),
        "loss_history": [float(v) for v in history.history.get("loss", [])],
        "resumed_from_epoch": resumed_from,
        "best_val_loss": min(val_losses) if val_losses else None,
        "final_learning_rate": float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)),
        "seconds": round(time.perf_counter() - start, 2),
    }


def _backup_epoch(checkpoint_dir: Path) -> int | None:
    """Returns the number of epochs a BackupAndRestore backup already holds, if any."""
    metadata = Path(checkpoint_dir) / "training_metadata.json"
    if not metadata.is_file():
        return None
    try:
        return int(json.loads(metadata.read_text())["epoch"])  # epochs completed
    except (ValueError, KeyError):
        return None
