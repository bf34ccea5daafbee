"""Losses of the library, registered so that a ``.keras`` file using them loads after ``import seqapps``."""
from __future__ import annotations

from typing import Any

import keras
import numpy as np


@keras.saving.register_keras_serializable(package="seqapps")
def per_token_training_loss(y_true: Any, y_pred: Any) -> Any:
    """The loss of a model whose output already is the per-token loss (``BatchNCE`` with targets)."""
    del y_true
    return y_pred



@keras.saving.register_keras_serializable(package="seqapps")
class ScaledMeanAbsoluteError(keras.losses.Loss):
    """Mean absolute error with each target divided by its training standard deviation.

    The model forecasts in the user's units; dividing by the scale keeps targets of
    different units comparable and gradients of a sensible size for clipping.

    Args:
        scale: one positive number per target column.
    """

    def __init__(self, scale: list[float], name: str = "scaled_mae", **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        self.scale = [float(s) for s in scale]

    def call(self, y_true: Any, y_pred: Any) -> Any:
        scale = keras.ops.convert_to_tensor(np.array(self.scale, "float32"))
        return keras.ops.mean(keras.ops.abs(y_true - y_pred) / scale, axis=-1)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "scale": self.scale}
