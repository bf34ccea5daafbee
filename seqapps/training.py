"""One training loop for every pipeline.

It is ``keras.Model.fit`` with the callbacks every run needs: early stopping on
validation loss (best weights restored), the learning rate halved on plateau,
global gradient-norm clipping, a NaN guard that stops with an error, and
``BackupAndRestore`` checkpoints so that a killed run resumes where it stopped.
Models are built under the chosen ``tf.distribute`` strategy.
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import keras
import tensorflow as tf

from seqapps.config import TrainingConfig
from seqapps.errors import ConfigError, TrainingError
from seqapps.pipeline import Pipeline, Splits

STRATEGIES = ("auto", "mirrored", "multiworker")


def make_strategy(name: str) -> tf.distribute.Strategy:
    """Returns the distribution strategy for ``--strategy``.

    Args:
        name: "auto" (the default strategy: one device), "mirrored" (all local
            GPUs; without GPUs, every logical CPU device) or "multiworker"
            (MultiWorkerMirroredStrategy configured from the ``TF_CONFIG``
            environment variable).

    Returns:
        The strategy; create it before any other TensorFlow work.
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


def make_optimizer(config: TrainingConfig) -> keras.optimizers.Optimizer:
    """Returns the configured optimizer with global gradient-norm clipping."""
    clip = {"global_clipnorm": config.clipnorm} if config.clipnorm > 0 else {}
    if config.optimizer == "sgd":
        return keras.optimizers.SGD(learning_rate=config.learning_rate, **clip)
    return keras.optimizers.Adam(learning_rate=config.learning_rate, **clip)


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
        TrainingError: the loss became NaN or infinite.
    """
    keras.utils.set_random_seed(config.seed)
    train, val = batch_datasets(data, config)
    resumed_from = _backup_epoch(checkpoint_dir)
    callbacks = [
        keras.callbacks.BackupAndRestore(str(checkpoint_dir), delete_checkpoint=True),
        _StopOnNonFiniteLoss(),
        keras.callbacks.EarlyStopping(monitor="val_loss", patience=config.early_stopping_patience,
                                      restore_best_weights=True),
        keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=config.lr_patience,
                                          min_lr=config.learning_rate / 64),
        *extra_callbacks,
    ]
    start = time.perf_counter()
    history = model.fit(train, validation_data=val, epochs=config.epochs, steps_per_epoch=config.steps_per_epoch,
                        callbacks=callbacks, shuffle=False, verbose=1 if verbose else 0)
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
