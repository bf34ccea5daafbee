"""Every Keras object the library registers, so that ``.keras`` files load after ``import seqapps``.

``seqapps/__init__.py`` imports this module as soon as Keras is imported (not
before, so that ``import seqapps`` and the command line stay free of TensorFlow
until they need it). Importing the modules below registers their objects. A module
that is itself importing Keras at that moment is still half initialised: it is left
to finish, and registers its objects then. ``LAYERS`` and ``OTHERS`` are resolved
on first use; the shared layer test harness runs on every class in ``LAYERS``.
"""
from __future__ import annotations

import importlib
from typing import Any

#: Where each registered object lives: module -> names.
REGISTERED = {
    "seqapps.layers.attention_decoder": ("AttentionDecoder", "PaddingMask"),
    "seqapps.layers.batch_nce": ("BatchNCE",),
    "seqapps.layers.ctc": ("CTCSpeechModel",),
    "seqapps.layers.hierarchical_rnn": ("DecoupledHRNN",),
    "seqapps.layers.hrnn_model": ("HRNNSequenceModel",),
    "seqapps.layers.lexicon": ("LexiconBias",),
    "seqapps.layers.ngram_context": ("NGramContext",),
    "seqapps.layers.spectrogram": ("LogMelSpectrogram", "SpecAugment", "TimeStatistics"),
    "seqapps.layers.time_features": ("CalendarFeatures", "SeasonalDifference", "SeasonalNaive"),
    "seqapps.losses": ("ScaledMeanAbsoluteError", "per_token_training_loss"),
    "seqapps.training": ("SGD", "Adam"),
}
_MODELS_AND_FUNCTIONS = {"HRNNSequenceModel", "CTCSpeechModel", "ScaledMeanAbsoluteError", "per_token_training_loss",
                         "SGD", "Adam"}

for _module in REGISTERED:
    importlib.import_module(_module)


def __getattr__(name: str) -> Any:
    """``LAYERS``: the registered layers; ``OTHERS``: the registered models, losses, optimizers and functions."""
    if name not in ("LAYERS", "OTHERS"):
        raise AttributeError(name)
    objects = [getattr(importlib.import_module(module), item) for module, items in REGISTERED.items()
               for item in items]
    if name == "LAYERS":
        return tuple(o for o in objects if o.__name__ not in _MODELS_AND_FUNCTIONS)
    return tuple(o for o in objects if o.__name__ in _MODELS_AND_FUNCTIONS)
