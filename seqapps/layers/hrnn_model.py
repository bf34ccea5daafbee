"""A Keras model that trains a ``DecoupledHRNN`` with its memory-lean gradients inside ``Model.fit``.

``HRNNSequenceModel.train_step`` calls ``DecoupledHRNN.loss_and_gradients`` (segment
recomputation in ``gr_hrnn``/``decoupled`` mode, windowed backpropagation in
``mr_hrnn``, plain autodiff in ``hrnn``) and applies the gradients with the compiled
optimizer, so the shared loop (early stopping, LR halving, global-norm clipping,
BackupAndRestore) trains it unchanged. Targets are per step: ``(batch, T, 2)`` holding
the class id and a loss weight, so a task scores only some steps (the copied bits,
the last pixel) by giving the others weight 0.

``seqapps.hrnn.build_hrnn`` turns a pipeline's ``HRNNConfig`` into the layer.
"""
from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from seqapps.layers.hierarchical_rnn import DecoupledHRNN


def weighted_sparse_crossentropy(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
    """Per-example cross-entropy (nats) of one step, times the step's weight.

    Args:
        y_true: (..., 2): the class id and the weight.
        y_pred: (..., classes) logits.

    Returns:
        (...,) weighted losses.
    """
    labels = tf.cast(y_true[..., 0], tf.int32)
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=y_pred)
    return losses * tf.cast(y_true[..., 1], y_pred.dtype)


@keras.saving.register_keras_serializable(package="seqapps")
class HRNNSequenceModel(keras.Model):
    """Per-step classifier around a ``DecoupledHRNN`` whose ``fit`` uses the lean gradients.

    Args:
        hrnn: the layer (or its serialised config); it must have ``output_units`` set.
        one_hot_depth: if set, inputs are integer ids (batch, T) one-hot encoded to this
            depth; otherwise inputs are real features (batch, T, features).
        boundary_ids: with ``one_hot_depth``, ids after which the upper level ticks (word
            ends); None ticks every ``periods[0]`` steps.
        **kwargs: ``keras.Model`` arguments (``name``).

    Call arguments:
        inputs: ids (batch, T) or features (batch, T, features).
        training: passed to the layer.
        mask: boolean (batch, T) mask of valid steps.

    Returns:
        Logits (batch, T, classes); zeros at masked steps.
    """

    def __init__(self, hrnn: DecoupledHRNN | dict, one_hot_depth: int | None = None,
                 boundary_ids: list[int] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hrnn = hrnn if isinstance(hrnn, DecoupledHRNN) else keras.saving.deserialize_keras_object(hrnn)
        if self.hrnn.output_units is None:
            raise ValueError("the DecoupledHRNN of an HRNNSequenceModel needs output_units")
        if boundary_ids is not None and one_hot_depth is None:
            raise ValueError("boundary_ids needs one_hot_depth (integer id inputs)")
        self.one_hot_depth = one_hot_depth
        self.boundary_ids = None if boundary_ids is None else [int(i) for i in boundary_ids]
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.supports_masking = True

    def build(self, input_shape: Any) -> None:
        features = self.one_hot_depth or int(input_shape[-1])
        if not self.hrnn.built:
            self.hrnn.build((None, None, features))

    def layer_inputs(self, inputs: tf.Tensor) -> tf.Tensor | list[tf.Tensor]:
        """Turns model inputs into the layer's ``x`` or ``[x, boundaries]``."""
        if self.one_hot_depth is None:
            return tf.cast(inputs, self.compute_dtype)
        ids = tf.cast(inputs, tf.int32)
        x = tf.one_hot(ids, self.one_hot_depth, dtype=self.compute_dtype)
        if self.boundary_ids is None:
            return x
        boundaries = tf.reduce_any(tf.equal(ids[..., None], tf.constant(self.boundary_ids, tf.int32)), axis=-1)
        return [x, boundaries]

    def call(self, inputs: tf.Tensor, training: bool | None = None, mask: tf.Tensor | None = None) -> tf.Tensor:
        return self.hrnn(self.layer_inputs(inputs), training=training, mask=mask)

    @property
    def metrics(self) -> list[keras.metrics.Metric]:
        return [self.loss_tracker]

    def train_step(self, data: tuple) -> dict[str, tf.Tensor]:
        inputs, targets = data[0], data[1]
        loss, grads = self.hrnn.loss_and_gradients(self.layer_inputs(inputs), targets, weighted_sparse_crossentropy)
        # Under tf.distribute the optimizer sums the replicas' gradients; each replica's are of
        # its local mean loss, so scale them to give the gradient of the global-batch mean.
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if replicas > 1:
            grads = [grad / replicas for grad in grads]
        self.optimizer.apply(grads, self.hrnn.trainable_variables)
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

    def test_step(self, data: tuple) -> dict[str, tf.Tensor]:
        """Validation loss: the task loss alone (no decoder terms), comparable across modes."""
        inputs, targets = data[0], data[1]
        logits = self(inputs, training=False)
        self.loss_tracker.update_state(tf.reduce_mean(weighted_sparse_crossentropy(targets, logits)))
        return {"loss": self.loss_tracker.result()}

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name, "hrnn": keras.saving.serialize_keras_object(self.hrnn),
                "one_hot_depth": self.one_hot_depth, "boundary_ids": self.boundary_ids}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "HRNNSequenceModel":
        return cls(**config)
