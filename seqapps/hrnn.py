"""The hierarchy the HRNN pipelines share (copy_task, pixel_mnist, hrnn_char_lm): an ``HRNNConfig`` as a layer.

The layers know no config (``seqapps.layers`` imports only layers and Keras); this is where a
config's hierarchy settings become a ``seqapps.layers.hierarchical_rnn.DecoupledHRNN``.
"""
from __future__ import annotations

import keras

from seqapps.config import HRNNConfig
from seqapps.layers.hierarchical_rnn import DecoupledHRNN

#: ``HRNNConfig.cell`` -> the Keras cell of each level.
CELLS = {"lstm": keras.layers.LSTMCell, "gru": keras.layers.GRUCell}


def build_hrnn(config: HRNNConfig, output_units: int, aux_loss: str) -> DecoupledHRNN:
    """Returns the ``DecoupledHRNN`` that ``config`` describes, with a linear head of ``output_units`` logits.

    Args:
        config: the hierarchy's settings.
        output_units: classes per step.
        aux_loss: the level-1 decoder's loss ("mse" or "categorical_crossentropy").

    Returns:
        An unbuilt layer.
    """
    beta = config.beta  # None: the layer's default for the mode
    if isinstance(beta, list):
        beta = [float(b) for b in beta] if len(beta) > 1 else float(beta[0])
    return DecoupledHRNN([CELLS[config.cell](units) for units in config.units], periods=config.period_list(),
                         mode=config.mode, beta=beta,
                         aux_hidden_units=config.aux_hidden_units, aux_loss=aux_loss,
                         output_units=output_units, seed=config.seed, name="hrnn")
