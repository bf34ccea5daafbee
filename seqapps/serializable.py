"""Every Keras object the library registers, so that ``.keras`` files load after ``import seqapps``.

``seqapps/__init__.py`` imports this module as soon as Keras is imported (not
before, so that ``import seqapps`` and the command line stay free of TensorFlow
until they need it). The shared layer test harness runs on every class in
``LAYERS``.
"""
from __future__ import annotations

from seqapps.data.audio import LogMelSpectrogram
from seqapps.layers.batch_nce import BatchNCE
from seqapps.layers.hierarchical_rnn import DecoupledHRNN
from seqapps.layers.hrnn_model import HRNNSequenceModel
from seqapps.layers.ngram_context import NGramContext
from seqapps.layers.time_features import CalendarFeatures, SeasonalDifference, SeasonalNaive
from seqapps.losses import ScaledMeanAbsoluteError, per_token_training_loss

#: The registered layers (the layer test harness runs on each).
LAYERS = (BatchNCE, DecoupledHRNN, NGramContext, CalendarFeatures, SeasonalDifference, SeasonalNaive,
          LogMelSpectrogram)
#: The registered models, losses and functions.
OTHERS = (HRNNSequenceModel, ScaledMeanAbsoluteError, per_token_training_loss)
