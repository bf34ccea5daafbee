"""Every Keras object the library registers, and ``load_model``, the one way to load a seqapps ``.keras`` file.

Each object is registered by its ``keras.saving.register_keras_serializable(package="seqapps")``
decorator when its module is imported; importing this module imports them all (and TensorFlow).
Nothing registers them behind the caller's back: code that loads a ``.keras`` file calls
``load_model`` (or imports this module first), so that the file loads without its pipeline module.
``LAYERS`` and ``OTHERS`` are resolved on first use; the shared layer test harness runs on every
class in ``LAYERS``.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import keras

#: Where each registered object lives: module -> names.
REGISTERED = {
    "seqapps.layers.attention_decoder": ("AttentionDecoder", "PaddingMask"),
    "seqapps.layers.batch_nce": ("BatchNCE",),
    "seqapps.layers.ctc": ("CTCSpeechModel",),
    "seqapps.layers.hierarchical_rnn": ("BidirectionalHRNN", "DecoupledHRNN"),
    "seqapps.layers.hrnn_model": ("HRNNSequenceModel",),
    "seqapps.layers.image_streams": ("LocalContrastNorm", "RandomChannelMix"),
    "seqapps.layers.lexicon": ("LexiconBias",),
    "seqapps.layers.ngram_context": ("NGramContext",),
    "seqapps.layers.spectrogram": ("LogMelSpectrogram", "SpecAugment", "TimeStatistics"),
    "seqapps.layers.time_features": ("CalendarFeatures", "SeasonalDifference", "SeasonalNaive", "Shrinkage"),
    "seqapps.losses": ("ScaledMeanAbsoluteError", "per_token_training_loss"),
    "seqapps.training": ("SGD", "Adam"),
}
_MODELS_AND_FUNCTIONS = {"HRNNSequenceModel", "CTCSpeechModel", "ScaledMeanAbsoluteError", "per_token_training_loss",
                         "SGD", "Adam"}

for _module in REGISTERED:
    importlib.import_module(_module)


def load_model(path: str | Path) -> keras.Model:
    """Loads a ``.keras`` file that may hold seqapps objects (all of them registered by this module's import).

    Args:
        path: the file, e.g. an export's ``assets.extra/model.keras`` (``ExportInfo.keras_model_path``).

    Returns:
        The model, compiled as it was saved.
    """
    return keras.saving.load_model(path)


def __getattr__(name: str) -> Any:
    """``LAYERS``: the registered layers; ``OTHERS``: the registered models, losses, optimizers and functions."""
    if name not in ("LAYERS", "OTHERS"):
        raise AttributeError(name)
    objects = [getattr(importlib.import_module(module), item) for module, items in REGISTERED.items()
               for item in items]
    if name == "LAYERS":
        return tuple(o for o in objects if o.__name__ not in _MODELS_AND_FUNCTIONS)
    return tuple(o for o in objects if o.__name__ in _MODELS_AND_FUNCTIONS)
