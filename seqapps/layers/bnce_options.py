"""The choices of ``seqapps.layers.batch_nce.BatchNCE``, importable without TensorFlow.

The layer checks its arguments against them, and ``seqapps.config`` validates a config's
fields with them before TensorFlow is imported.
"""

#: the training criteria of the output layer
LOSSES = ("bnce", "snce", "softmax")
#: B-NCE's batch over ``[B, T]`` targets: the ``B`` targets of one time step (the paper's), or all ``B x T``
NOISE_SCOPES = ("time_step", "batch")
