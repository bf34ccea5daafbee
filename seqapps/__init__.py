"""seqapps: recurrent-network applications on Keras 3 / TensorFlow."""

__version__ = "0.1.0"
