"""The few workarounds for Keras and TensorFlow internals, in one place.

Each one names the private API it touches, the versions it was written for, and
when to drop it; ``tests/test_compat.py`` checks each against the installed Keras,
so an upgrade that breaks one fails there first.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Iterator

import keras
import tensorflow as tf

#: The Keras release these workarounds were written and tested for.
WRITTEN_FOR_KERAS = "3.15"


def all_layers(model: keras.Model) -> Iterator[keras.layers.Layer]:
    """Yields ``model`` and every layer nested in it, at any depth.

    Keras 3 has no public recursive iterator; ``Layer._flatten_layers`` is the one
    ``Model.summary`` uses. Drop this when Keras offers a public one.
    """
    yield from model._flatten_layers(include_self=True, recursive=True)  # noqa: SLF001


def build_once_from_batch(model: keras.Model, batch: Any) -> None:
    """Builds ``model`` from one local batch and stops Keras from building it again.

    Before each ``fit``, ``evaluate`` and ``predict``, Keras 3.15 averages the first
    batch across replicas with ``strategy.reduce`` to build the model, even when it is
    built. That fails on a batch that splits unevenly (a last, short batch) and,
    across workers, for nested inputs (keras-team/keras#20329). Here the model is built
    from a local batch (``Model._symbolic_build``) and ``Model._maybe_symbolic_build``
    is replaced by a no-op on this instance. Drop it when keras#20329 is fixed.

    Args:
        model: a compiled model under a strategy with more than one replica.
        batch: one batch of the training data.
    """
    with model.distribute_strategy.scope():
        model._symbolic_build(data_batch=batch)  # noqa: SLF001
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None  # noqa: SLF001


def batch_predictor(model: keras.Model) -> Callable[[Any], Any]:
    """``model(inputs, training=False)`` compiled once, for scoring many batches under any strategy.

    ``model.predict_on_batch`` does not split a batch across a ``tf.distribute`` strategy's
    replicas (Keras 3.15: with two mirrored replicas it returns the batch's outputs twice),
    and ``model.predict`` over a whole split would hold every output at once; a plain
    call in a ``tf.function`` reads the (mirrored) variables and computes each batch once.
    One function per model, kept as long as the model lives, so it is traced once. Drop it
    when ``predict_on_batch`` returns one output per row under a strategy with several replicas.

    Args:
        model: a built Keras model (under any strategy).

    Returns:
        A function of one batch of inputs that returns the model's outputs as tensors.
    """
    if model not in _PREDICTORS:
        own = weakref.ref(model)  # the function must not keep its model alive
        _PREDICTORS[model] = tf.function(lambda inputs: own()(inputs, training=False), reduce_retracing=True)
    return _PREDICTORS[model]


_PREDICTORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def make_logs_reducible_across_workers(model: keras.Model) -> None:
    """Gives each step's logs a leading axis of one, so that Keras can average them over workers.

    Across workers, Keras 3.15 averages the logs with ``strategy.reduce("MEAN", v,
    axis=0)``, which fails on scalar logs. With the extra axis the reduction averages
    over replicas, and every worker sees the same logs (so early stopping and
    learning-rate decisions agree). Drop it when Keras reduces scalar logs itself.

    Args:
        model: a compiled model under MultiWorkerMirroredStrategy.
    """
    for name in ("train_step", "test_step"):
        step = getattr(model, name)
        setattr(model, name, lambda data, step=step: tf.nest.map_structure(lambda v: v[None], step(data)))


def adam_moments(optimizer: keras.optimizers.Adam, variable: Any) -> tuple[keras.Variable, keras.Variable]:
    """Returns the first and second moment slots that ``optimizer`` keeps for ``variable``.

    Keras 3.15 has no public accessor: ``Adam.update_step`` reads ``_momentums`` and
    ``_velocities`` at ``_get_variable_index(variable)``. A fused update kernel
    (``seqapps.training.Adam``) needs the same slots. Drop it when Keras exposes them.

    Args:
        optimizer: a built Adam optimizer.
        variable: one of its trainable variables (a ``keras.Variable`` or its ``tf.Variable``).

    Returns:
        ``(m, v)``, the optimizer's own variables.
    """
    index = optimizer._get_variable_index(variable)  # noqa: SLF001
    return optimizer._momentums[index], optimizer._velocities[index]  # noqa: SLF001


class OwnGradientClipping:
    """Optimizer mixin: ``clip_gradients(grads)`` decides the gradients that are applied.

    Keras 3 has no public hook between the gradients and the update; every optimizer
    passes them through the private ``BaseOptimizer._clip_gradients`` (``clipnorm``,
    ``clipvalue``, ``global_clipnorm``) inside ``apply_gradients``. This mixin routes
    that call to a public method. Put it before the Keras optimizer in the bases, and
    drop it when Keras offers a gradient-transform hook.
    """

    def clip_gradients(self, grads: list) -> list:
        """Returns the gradients to apply. Default: Keras' own clipping.

        Args:
            grads: one gradient (a tensor or ``IndexedSlices``) per trainable variable.

        Returns:
            The gradients to apply, in the same order.
        """
        return super()._clip_gradients(grads)  # noqa: SLF001

    def _clip_gradients(self, grads: list) -> list:
        return self.clip_gradients(grads)
