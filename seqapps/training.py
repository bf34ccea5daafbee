"""One training loop for every pipeline.

It is ``keras.Model.fit`` with the callbacks every run needs: early stopping on
validation loss (best weights restored), the learning rate halved on plateau,
global gradient-norm clipping, a NaN guard that stops with an error, and
``BackupAndRestore`` checkpoints so that a killed run resumes where it stopped.
The backup holds the weights, the optimizer, the epoch, the state of early
stopping and of the learning-rate schedule, and the layers' seed generators (the
dropout masks); each epoch's data order depends on the seed and the epoch alone.
So a killed and resumed run trains exactly as the uninterrupted one. The backup stays until the caller removes it (after export).
Models are built under the chosen ``tf.distribute`` strategy; with several workers,
the chief keeps the backup that every worker resumes from.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np

import keras
import tensorflow as tf

from seqapps import compat
from seqapps.config import TrainingConfig
from seqapps.errors import ConfigError, TrainingError

STRATEGIES = ("auto", "mirrored", "multiworker")
#: the largest finite float32: TensorBoard stores scalars as float32.
FLOAT32_MAX = float(np.finfo(np.float32).max)


class TrainingData(Protocol):
    """What the loop reads of a pipeline's splits (``seqapps.pipeline.Splits`` is one).

    The loop knows no pipeline: ``seqapps.pipeline`` imports this module (its default ``fit``),
    never the other way round.

    Attributes:
        train, val: ``tf.data.Dataset``s of ``(inputs, targets)``, unbatched.
        padding_values: what each component of an element of varying length is padded with in a batch,
            a structure like the element's (None: zeros, ``padded_batch``'s default).
        batch_map: a function applied to every padded training, validation and timing batch, called as
            ``tf.data.Dataset.map`` calls it (None: none).
    """

    train: tf.data.Dataset
    val: tf.data.Dataset
    padding_values: Any
    batch_map: Callable[..., Any] | None


class ModelMaker(Protocol):
    """What ``build_and_compile`` calls of a pipeline (``seqapps.pipeline.Pipeline`` is one)."""

    def build_model(self, config: TrainingConfig, data: Any) -> keras.Model:
        """Returns a new, uncompiled model for ``data``."""

    def adapt_model(self, model: keras.Model, config: TrainingConfig, data: Any) -> keras.Model:
        """Returns a loaded model fitted to ``data`` (fine-tuning)."""

    def compile_args(self, config: TrainingConfig, data: Any) -> dict[str, Any]:
        """Returns ``model.compile`` arguments other than the optimizer."""


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
    own = _own_backup_dir(checkpoint_dir, strategy)
    if own == checkpoint_dir:
        return checkpoint_dir
    shutil.rmtree(own, ignore_errors=True)
    if checkpoint_dir.is_dir():
        # The chief cannot write a newer backup meanwhile: its next one needs this worker's steps.
        shutil.copytree(checkpoint_dir, own)
    return own


def _own_backup_dir(checkpoint_dir: Path, strategy: tf.distribute.Strategy) -> Path:
    if is_chief(strategy):
        return checkpoint_dir
    resolver = strategy.cluster_resolver
    return checkpoint_dir.with_name(f"{checkpoint_dir.name}-{resolver.task_type}-{resolver.task_id}")


def remove_backup(checkpoint_dir: Path, strategy: tf.distribute.Strategy) -> None:
    """Deletes this worker's backup of a run (call it once the run's export is in place).

    Args:
        checkpoint_dir: the folder given to ``fit``.
        strategy: the run's strategy (a non-chief worker removes its own copy).
    """
    own = _own_backup_dir(Path(checkpoint_dir), strategy)
    shutil.rmtree(own, ignore_errors=True)
    with contextlib.suppress(OSError):  # drop the empty parent folder too
        own.parent.rmdir()


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


class _DenseEquivalentClipping(compat.OwnGradientClipping):
    """Optimizer mixin: duplicate sparse rows summed before clipping and the update."""

    def clip_gradients(self, grads: list) -> list:
        if self.global_clipnorm and self.global_clipnorm > 0:
            return clip_by_global_norm(grads, self.global_clipnorm)
        return super().clip_gradients([sum_duplicate_rows(g) for g in grads])


@keras.saving.register_keras_serializable(package="seqapps")
class SGD(_DenseEquivalentClipping, keras.optimizers.SGD):
    """``keras.optimizers.SGD`` whose sparse gradients clip and update as their dense sums do."""


@keras.saving.register_keras_serializable(package="seqapps")
class Adam(_DenseEquivalentClipping, keras.optimizers.Adam):
    """``keras.optimizers.Adam`` whose sparse gradients clip and update as their dense sums do.

    Keras' Adam squares each duplicate slice on its own, so without the summing its second
    moment would differ from the dense gradient's.

    On the TensorFlow backend each variable's update is one fused ``ResourceApplyAdam`` kernel:
    the same equations as ``keras.optimizers.Adam.update_step``, which makes about a dozen
    elementwise passes over each variable and its two moments. With large embeddings that
    saves 4-6 % of a translation B-NCE step (docs/results.md, "Adam's update in one kernel").
    """

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        """Applies one Adam step to ``variable`` with a single fused kernel (Keras' own with ``amsgrad``).

        Args:
            gradient: the (clipped) gradient, dense or ``tf.IndexedSlices`` (densified, as Keras does).
            variable: the ``tf.Variable`` (or its Keras wrapper) to update.
            learning_rate: the current learning rate.
        """
        if self.amsgrad or keras.backend.backend() != "tensorflow":
            super().update_step(gradient, variable, learning_rate)
            return
        momentum, velocity = compat.adam_moments(self, variable)
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)

        def handle(var: Any) -> Any:
            return (var.value if isinstance(var, keras.Variable) else var).handle

        tf.raw_ops.ResourceApplyAdam(
            var=handle(variable), m=handle(momentum), v=handle(velocity),
            beta1_power=tf.pow(tf.cast(self.beta_1, dtype), step),
            beta2_power=tf.pow(tf.cast(self.beta_2, dtype), step),
            lr=tf.cast(learning_rate, dtype), beta1=tf.cast(self.beta_1, dtype),
            beta2=tf.cast(self.beta_2, dtype), epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(tf.convert_to_tensor(gradient), dtype))


def make_optimizer(config: TrainingConfig) -> keras.optimizers.Optimizer:
    """Returns the configured optimizer with global gradient-norm clipping (see ``clip_by_global_norm``)."""
    clip = {"global_clipnorm": config.clipnorm} if config.clipnorm > 0 else {}
    if config.optimizer == "sgd":
        return SGD(learning_rate=config.learning_rate, **clip)
    return Adam(learning_rate=config.learning_rate, **clip)


def seconds_per_training_step(model: keras.Model, config: TrainingConfig, compile_args: dict[str, Any],
                              data: TrainingData, steps: int) -> float:
    """Times training steps of a fresh copy of ``model`` (the trained weights are not touched).

    Args:
        model: the model; its config is copied and compiled with ``make_optimizer(config)``.
        config: batch size and optimizer settings.
        compile_args: the pipeline's other ``compile`` arguments (loss, ``jit_compile``).
        data: its unbatched training split of ``(inputs, targets[, weights])`` elements, batched as
            ``batch_datasets`` batches it.
        steps: timed steps, after an untimed pass that traces and compiles.

    Returns:
        The mean seconds of one step (batches of ``config.batch_size``).
    """
    return _timed_steps(model, config, compile_args, _timing_batches(data, config, steps))


def training_tokens_per_second(model: keras.Model, config: Any, compile_args: dict[str, Any],
                               data: TrainingData) -> float:
    """A sequence-to-sequence model's training target tokens per second (``seconds_per_training_step``).

    The tokens are the real (non-zero weight) target tokens of the timed batches themselves: a model that
    skips padding (``BatchNCE(compact_batch=True)``) takes longer on longer sentences, so a mean over the
    whole split would misstate it.

    Args:
        model, compile_args, data: as ``seconds_per_training_step``; the training elements carry weights.
        config: its ``batch_size`` and ``timing_steps`` (the timed steps), and the optimizer settings.

    Returns:
        The timed batches' target tokens per second.
    """
    batches = _timing_batches(data, config, config.timing_steps)
    step = _timed_steps(model, config, compile_args, batches)
    tokens = sum(float(np.count_nonzero(batch[2])) for batch in batches[1:]) / config.timing_steps
    return round(tokens / step, 1)


def _timing_batches(data: TrainingData, config: TrainingConfig, steps: int) -> list[tuple]:
    """The first ``steps + 1`` full batches of the training split (repeated when it is shorter), padded, grouped by
    length and mapped as training batches them (``batch_datasets``): one to trace, ``steps`` to time."""
    return list(_padded_batches(data.train.repeat(), data, config, config.seed, drop_remainder=True).take(steps + 1))


def _padded_batches(elements: tf.data.Dataset, data: TrainingData, config: TrainingConfig, seed: int,
                    group: bool = True, drop_remainder: bool = False) -> tf.data.Dataset:
    """``elements`` in batches padded with ``data.padding_values``, grouped by length when ``group`` and
    ``config.length_sorted_batches`` > 1, and mapped by ``data.batch_map`` when it has one."""
    if group and config.length_sorted_batches > 1:
        batches = length_grouped_batches(elements, config.batch_size, config.length_sorted_batches, seed,
                                         data.padding_values)
    else:
        batches = elements.padded_batch(config.batch_size, padding_values=data.padding_values,
                                        drop_remainder=drop_remainder)
    return batches.map(data.batch_map) if data.batch_map is not None else batches


def _timed_steps(model: keras.Model, config: TrainingConfig, compile_args: dict[str, Any],
                 batches: list[tuple]) -> float:
    """Mean seconds of a training step of a fresh copy of ``model`` over ``batches[1:]``, after an untimed pass over
    all ``batches``: batches of different widths retrace the step until its trace generalises, and the timed
    steps must not include tracing."""
    copy = keras.Model.from_config(model.get_config())
    copy.compile(optimizer=make_optimizer(config), **compile_args)
    for batch in batches:
        copy.train_on_batch(*batch)
    start = time.perf_counter()
    for batch in batches[1:]:
        copy.train_on_batch(*batch)
    return (time.perf_counter() - start) / (len(batches) - 1)


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


def _element_lengths(window: Any) -> tf.Tensor:
    """The length of each element of a ``ragged_batch``: the sum of its components' first-axis lengths."""
    lengths = [tf.cast(part.row_lengths(), tf.int32) if isinstance(part, tf.RaggedTensor)
               else tf.fill(tf.shape(part)[:1], tf.size(part[0])) for part in tf.nest.flatten(window)]
    return tf.add_n(lengths)


def length_grouped_batches(elements: tf.data.Dataset, batch_size: int, window_batches: int,
                           seed: int, padding_values: Any = None) -> tf.data.Dataset:
    """Padded batches of elements of similar length, in a shuffled order.

    Each window of ``batch_size * window_batches`` consecutive elements is sorted by length
    (``_element_lengths``) and cut into batches, and the batches are shuffled within a buffer of
    ``window_batches``. Every element is in exactly one batch, and there are as many batches as
    ``padded_batch(batch_size)`` makes: the windows hold whole batches. Sorting within windows of an
    already shuffled stream is the usual compromise between less padding and random batches.

    Args:
        elements: unbatched elements, already shuffled.
        batch_size: elements per batch.
        window_batches: batches per sorted window.
        seed: seed of the batches' shuffle.
        padding_values: as ``TrainingData.padding_values`` (None: zeros).

    Returns:
        The batched dataset.
    """
    is_tuple = isinstance(elements.element_spec, tuple)

    def whole(function: Callable[[Any], Any]) -> Callable[..., Any]:
        """``function`` of the whole element: ``map`` passes a tuple's parts as separate arguments."""
        return lambda *parts: function(parts if is_tuple else parts[0])

    def sort_by_length(window: Any) -> Any:
        order = tf.argsort(_element_lengths(window), stable=True)
        return tf.nest.map_structure(lambda part: tf.gather(part, order), window)

    def dense(element: Any) -> Any:  # an unbatched ragged component is a ragged_rank 0 one
        return tf.nest.map_structure(lambda part: part.to_tensor() if isinstance(part, tf.RaggedTensor) else part,
                                     element)

    windows = elements.ragged_batch(batch_size * window_batches).map(whole(sort_by_length)).unbatch().map(whole(dense))
    return windows.padded_batch(batch_size, padding_values=padding_values).shuffle(window_batches, seed=seed)


def batch_datasets(data: TrainingData, config: TrainingConfig,
                   first_epoch: int = 0) -> tuple[tf.data.Dataset, tf.data.Dataset, int]:
    """Shuffles and batches the train split for epochs ``first_epoch..epochs-1``, batches the validation split.

    Elements of varying length (audio clips, transcripts, sentences) are padded to the longest in their batch
    with ``data.padding_values`` (zeros by default; grouped by length first when ``config.length_sorted_batches`` > 1)
    and mapped by ``data.batch_map``; fixed-size
    elements batch as they are. Epoch ``e`` is shuffled with a seed made of ``config.seed`` and ``e``, so a run resumed
    at epoch ``e`` sees the same batches as a run that never stopped.

    Args:
        data: the unbatched splits.
        config: batch size, seed, epochs and ``steps_per_epoch``.
        first_epoch: the first epoch still to train (the epoch a backup holds).

    Returns:
        ``(train, val, steps_per_epoch)``: the train dataset holds every remaining epoch's
        batches back to back (at least one epoch's, so that Keras can build from it).
    """
    steps = config.steps_per_epoch
    if steps is None:
        rows = int(data.train.cardinality())
        if rows == tf.data.INFINITE_CARDINALITY:
            raise ConfigError("the training split is endless; set steps_per_epoch")
        if rows < 0:  # unknown: count one pass
            rows = int(data.train.reduce(np.int64(0), lambda count, _: count + 1))
        steps = max(1, math.ceil(rows / config.batch_size))

    def one_epoch(epoch: int) -> tf.data.Dataset:
        # A Python seed: with a tensor one (a flat_map over epochs), tf.data's seed check fails for seed=0.
        seed = config.seed * 10_007 + epoch
        shuffled = data.train.shuffle(4096, seed=seed, reshuffle_each_iteration=True)
        if config.steps_per_epoch is not None:
            shuffled = shuffled.repeat()
        return _padded_batches(shuffled, data, config, seed).take(steps)

    epochs = [one_epoch(epoch) for epoch in range(first_epoch, max(config.epochs, first_epoch + 1))]
    order = tf.data.Dataset.range(len(epochs)).flat_map(lambda index: tf.data.Dataset.from_tensors(index).repeat(steps))
    train = tf.data.Dataset.choose_from_datasets(epochs, order).prefetch(tf.data.AUTOTUNE)
    val = _padded_batches(data.val, data, config, config.seed, group=False).prefetch(tf.data.AUTOTUNE)
    return train, val, steps


def build_and_compile(pipeline: ModelMaker, config: TrainingConfig, data: TrainingData,
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


class _Backup(keras.callbacks.BackupAndRestore):
    """``BackupAndRestore`` that also keeps the state of other callbacks and the epoch history.

    Keras' backup holds the weights, the optimizer (with its learning rate) and the
    epoch. Early stopping's best weights and counters and the plateau schedule's
    counters live in the callbacks; without them a resumed run forgets its best epoch
    and restarts its patience. The layers' random state (each ``SeedGenerator``, which
    draws the dropout masks) is in ``model.variables`` but not in the saved weights;
    without it a resumed run draws the masks of epoch 1 again. This backup saves both
    with each epoch and restores them after the weights, so it must come after those
    callbacks in the list.

    Args:
        directory: the backup folder.
        stateful: the callbacks whose state to keep: EarlyStopping, ReduceLROnPlateau.
    """

    _FIELDS = {keras.callbacks.EarlyStopping: ("wait", "stopped_epoch", "best", "best_epoch"),
               keras.callbacks.ReduceLROnPlateau: ("wait", "best", "cooldown_counter")}

    def __init__(self, directory: Path, stateful: Sequence[keras.callbacks.Callback]) -> None:
        super().__init__(str(directory), double_checkpoint=True, delete_checkpoint=False)
        self.directory = Path(directory)
        self.stateful = list(stateful)
        self.history: list[dict[str, float]] = []

    def _fields(self, callback: keras.callbacks.Callback) -> tuple[str, ...]:
        return next(fields for kind, fields in self._FIELDS.items() if isinstance(callback, kind))

    def on_train_begin(self, logs: dict | None = None) -> None:
        super().on_train_begin(logs)
        state = read_callback_state(self.directory)
        if state is None:
            return
        self.history = state["history"]
        for callback, values in zip(self.stateful, state["callbacks"]):
            for field in self._fields(callback):
                setattr(callback, field, values[field])
            if getattr(callback, "restore_best_weights", False) and values.get("best_weights"):
                with np.load(self.directory / values["best_weights"]) as saved:
                    callback.best_weights = [saved[f"w{i}"] for i in range(len(saved.files))]
        for variable, value in zip(self._seed_states(), state["seed_states"], strict=True):
            variable.assign(np.asarray(value, variable.dtype))

    def _seed_states(self) -> list[Any]:
        """The model's ``SeedGenerator`` state variables: in ``variables`` but not in ``weights``."""
        weights = {id(weight) for weight in self.model.weights}
        return [variable for variable in self.model.variables if id(variable) not in weights]

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        done = epoch + 1
        self.history.append({key: float(value) for key, value in (logs or {}).items()})
        self.directory.mkdir(parents=True, exist_ok=True)
        states = []
        for index, callback in enumerate(self.stateful):
            values = {field: _plain(getattr(callback, field)) for field in self._fields(callback)}
            best = getattr(callback, "best_weights", None)
            if best is not None:
                values["best_weights"] = f"best-{index}-{done}.npz"
                with open(self.directory / values["best_weights"], "wb") as file:
                    np.savez(file, **{f"w{i}": w for i, w in enumerate(best)})
            states.append(values)
        state = {"epoch": done, "stopped": bool(self.model.stop_training), "history": self.history,
                 "callbacks": states,
                 "seed_states": [keras.ops.convert_to_numpy(v).tolist() for v in self._seed_states()]}
        partial = self.directory / f"callbacks-{done}.json.partial"
        partial.write_text(json.dumps(state))
        os.replace(partial, self.directory / f"callbacks-{done}.json")
        super().on_epoch_end(epoch, logs)  # the weights and the epoch, after the state they point to
        for old in self.directory.glob("*-*.*"):  # keep this epoch's state and the one before (double checkpoint)
            number = re.search(r"-(\d+)\.(json|npz)$", old.name)
            if number and int(number.group(1)) < done - 1:
                old.unlink(missing_ok=True)


def _plain(value: Any) -> Any:
    """A callback field as a JSON value (NumPy scalars become floats or ints)."""
    return value.item() if hasattr(value, "item") else value


def read_callback_state(checkpoint_dir: Path) -> dict[str, Any] | None:
    """Returns the callback state saved with the epoch a backup holds, or None without a backup."""
    epoch = _backup_epoch(checkpoint_dir)
    path = Path(checkpoint_dir) / f"callbacks-{epoch}.json"
    if epoch is None or not path.is_file():
        return None
    return json.loads(path.read_text())


class TrainingBudget(keras.callbacks.Callback):
    """A time budget for ``fit``, on one clock: stops training, and may lower the learning rate as it is spent.

    Training stops at the first step that ends past ``seconds`` (the epoch it cuts short is still validated).
    With ``final_rate``, the learning rate is set before each step, falling linearly with the time spent from
    ``initial_rate`` to ``final_rate`` at ``seconds`` (the linear decay of Li, Yumer and Ramanan, "Budgeted
    training", ICLR 2020).

    Args:
        seconds: the training budget, counted from the start of ``fit`` (a resumed run starts a new clock).
        initial_rate: the learning rate at the start (used with ``final_rate`` only).
        final_rate: the learning rate at ``seconds`` and after; None leaves the rate alone.
    """

    def __init__(self, seconds: float, initial_rate: float | None = None, final_rate: float | None = None) -> None:
        super().__init__()
        if final_rate is not None and initial_rate is None:
            raise ValueError("final_rate needs initial_rate")
        self.seconds, self.initial_rate, self.final_rate = seconds, initial_rate, final_rate

    def rate(self, elapsed: float) -> float:
        """The learning rate after ``elapsed`` seconds (with ``final_rate``)."""
        done = min(max(elapsed / self.seconds, 0.0), 1.0)
        return self.initial_rate + (self.final_rate - self.initial_rate) * done

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.start = time.perf_counter()

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self.final_rate is not None:
            self.model.optimizer.learning_rate.assign(self.rate(time.perf_counter() - self.start))

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if time.perf_counter() - self.start > self.seconds:
            self.model.stop_training = True


class _EpochLines(keras.callbacks.Callback):
    """Prints one line per epoch (loss, validation loss, learning rate, elapsed time, ETA) for logs and CI."""

    def __init__(self, epochs: int, label: str | None = None) -> None:
        super().__init__()
        self.epochs = epochs
        self.prefix = f"{label}: " if label else ""

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.start, self.first = time.perf_counter(), None

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        logs = logs or {}
        if self.first is None:
            self.first = epoch
        elapsed = time.perf_counter() - self.start
        eta = elapsed / (epoch + 1 - self.first) * (self.epochs - epoch - 1)
        values = "  ".join(f"{key} {float(value):.4g}" for key, value in logs.items()
                           if key in ("loss", "val_loss"))
        rate = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        print(f"{self.prefix}epoch {epoch + 1}/{self.epochs}  {values}  lr {rate:.3g}  elapsed {elapsed:.0f} s  "
              f"eta {eta:.0f} s", file=sys.stdout, flush=True)


PROGRESS = ("none", "bar", "lines")


class _EpochMetrics(keras.callbacks.Callback):
    """Adds a pipeline's validation metrics to each epoch's logs as ``val_NAME``, before the callbacks that read them."""

    def __init__(self, measure: Callable[[keras.Model], dict[str, float]]) -> None:
        super().__init__()
        self.measure = measure

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None:
            logs.update({f"val_{name}": _in_float32_range(value) for name, value in self.measure(self.model).items()})


def _in_float32_range(value: float) -> float:
    """``value`` as a float TensorBoard can store: a finite value beyond float32's range becomes infinity.

    A diverging language model's perplexity (say 4e100) is a valid double that TensorBoard's
    float32 summary refuses with a ValueError; infinity is what it means there.

    Args:
        value: a metric value.

    Returns:
        ``float(value)``, or signed infinity when its magnitude exceeds float32's largest value.
    """
    value = float(value)
    return value if abs(value) <= FLOAT32_MAX or math.isnan(value) else math.copysign(math.inf, value)


def fit(model: keras.Model, data: TrainingData, config: TrainingConfig, checkpoint_dir: Path,
        progress: str = "none", extra_callbacks: Sequence[keras.callbacks.Callback] = (),
        log_dir: Path | None = None,
        epoch_metrics: Callable[[keras.Model], dict[str, float]] | None = None,
        label: str | None = None) -> dict[str, Any]:
    """Trains ``model`` with the shared callbacks; resumes from ``checkpoint_dir`` if a backup is there.

    Args:
        model: a compiled model.
        data: the train and validation splits (unbatched).
        config: epochs, batch size, patience, seed.
        checkpoint_dir: where the backup is kept; it stays after training, so that a run
            killed later (during evaluation or export) does not train again. Remove it
            with ``remove_backup`` once the result is safe.
        progress: "bar" (Keras' progress bar, for a terminal), "lines" (one line per
            epoch on stdout, for logs) or "none".
        extra_callbacks: more callbacks, run after the backup of each epoch.
        log_dir: where Keras' TensorBoard callback writes the epoch logs (``train/``,
            ``validation/``); None for none.
        epoch_metrics: ``model -> {name: value}``, validation metrics measured after each epoch
            and logged as ``val_NAME`` (``Pipeline.epoch_metrics``).
        label: names this fit in the progress output, for a run that trains more than once (the
            prefix of each epoch line, or a heading line above Keras' progress bar); None for the run's
            one fit.

    Returns:
        A JSON-able report: epochs run (in total, before and after a restart), training
        and validation loss per epoch, ``history`` (every logged value per epoch: loss, learning
        rate, validation metrics), the epoch resumed from, best validation loss, final learning
        rate and seconds.

    Raises:
        TrainingError: the loss became NaN or infinite, or another worker stopped.
    """
    if progress not in PROGRESS:
        raise ValueError(f"progress={progress!r}: expected one of {', '.join(PROGRESS)}")
    keras.utils.set_random_seed(config.seed)
    strategy = model.distribute_strategy
    checkpoint_dir = worker_checkpoint_dir(Path(checkpoint_dir), strategy)
    resumed_from = _backup_epoch(checkpoint_dir)
    saved = read_callback_state(checkpoint_dir)
    epochs = saved["epoch"] if saved and saved["stopped"] else config.epochs  # stopped early: nothing is left
    train, val, steps_per_epoch = batch_datasets(data, config, first_epoch=min(resumed_from or 0, epochs))
    if strategy.num_replicas_in_sync > 1:
        _adapt_to_distribution(model, train)
    stateful: list[keras.callbacks.Callback] = [
        keras.callbacks.EarlyStopping(monitor="val_loss", patience=config.early_stopping_patience,
                                      restore_best_weights=True)]
    anneal = config.lr_schedule == "budget" and config.max_train_minutes is not None
    if not anneal:
        stateful.append(keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=config.lr_patience,
                                                          min_lr=config.learning_rate / 64))
    budget: list[keras.callbacks.Callback] = []
    if config.max_train_minutes is not None:
        if is_multi_worker(strategy):  # each worker's clock would stop it at its own epoch
            raise ConfigError("max_train_minutes does not work with --strategy multiworker; set epochs instead")
        budget.append(TrainingBudget(60 * config.max_train_minutes, config.learning_rate,
                                     config.learning_rate / 64 if anneal else None))
    backup = _Backup(checkpoint_dir, stateful)  # after the callbacks that stop training, so it records the stop
    measured = [_EpochMetrics(epoch_metrics)] if epoch_metrics else []  # first: the others read its values
    logs = [keras.callbacks.TensorBoard(str(log_dir), write_graph=False, profile_batch=0)] if log_dir else []
    callbacks = [*measured, _StopOnNonFiniteLoss(), *stateful, *budget, backup, *logs, *extra_callbacks]
    if progress == "lines":
        callbacks.append(_EpochLines(epochs, label))
    if label and progress == "bar":
        print(f"{label}:", file=sys.stdout, flush=True)
    start = time.perf_counter()
    try:
        model.fit(train, validation_data=val, epochs=epochs, steps_per_epoch=steps_per_epoch,
                  callbacks=callbacks, shuffle=False, verbose=1 if progress == "bar" else 0)
    except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError) as error:
        if not is_multi_worker(strategy):
            raise
        tasks = sorted(set(re.findall(r"/job:\w+/replica:\d+/task:\d+", str(error).partition("unhealthy")[2])))
        raise TrainingError(f"another worker stopped ({type(error).__name__}; unhealthy: {', '.join(tasks) or '?'}); "
                            "start every worker again with the same command to resume from the last backup") from None
    val_losses = [epoch["val_loss"] for epoch in backup.history if "val_loss" in epoch]
    logged = list(dict.fromkeys(key for epoch in backup.history for key in epoch))
    return {
        "epochs_run": len(backup.history),
        "steps": int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
        "loss_history": [epoch["loss"] for epoch in backup.history if "loss" in epoch],
        "val_loss_history": val_losses,
        "history": {key: [epoch.get(key) for epoch in backup.history] for key in logged},
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
