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

from seqapps import compat
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


def make_optimizer(config: TrainingConfig) -> keras.optimizers.Optimizer:
    """Returns the configured optimizer with global gradient-norm clipping."""
    clip = {"global_clipnorm": config.clipnorm} if config.clipnorm > 0 else {}
    if config.optimizer == "sgd":
        return keras.optimizers.SGD(learning_rate=config.learning_rate, **clip)
    return keras.optimizers.Adam(learning_rate=config.learning_rate, **clip)


def _adapt_to_distribution(model: keras.Model, train: tf.data.Dataset) -> None:
    """Works around Keras 3.15 ``fit``/``evaluate`` failures under tf.distribute (see ``seqapps.compat``).

    Args:
        model: a compiled model, built under a strategy with more than one replica.
        train: the batched training dataset (one batch is read to build the model).
    """
    compat.build_once_from_batch(model, next(iter(train)))
    if is_multi_worker(model.distribute_strategy):
        compat.make_logs_reducible_across_workers(model)


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
    """Shuffles and batches the train split, batches the validation split.

    Elements of varying length (audio clips, transcripts) are zero-padded to the longest
    in their batch; fixed-size elements batch as they are.
    """
    train = data.train.shuffle(4096, seed=config.seed, reshuffle_each_iteration=True)
    if config.steps_per_epoch is not None:
        train = train.repeat()
    train = train.padded_batch(config.batch_size).prefetch(tf.data.AUTOTUNE)
    val = data.val.padded_batch(config.batch_size).prefetch(tf.data.AUTOTUNE)
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
        load_model: when given, returns an existing model to continue training (through
            ``pipeline.adapt_model``).

    Returns:
        A compiled model whose variables live under ``strategy``.
    """
    with strategy.scope():
        model = (pipeline.adapt_model(load_model(), config, data) if load_model
                 else pipeline.build_model(config, data))
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
