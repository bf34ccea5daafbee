"""seqapps: recurrent-network applications on Keras 3 / TensorFlow.

``import seqapps`` imports no TensorFlow. The library's Keras objects are registered by their
``keras.saving.register_keras_serializable(package="seqapps")`` decorators when their modules are
imported; to load a seqapps ``.keras`` file, call ``seqapps.serializable.load_model``, which imports
them all first.
"""
from __future__ import annotations

__version__ = "0.1.0"
