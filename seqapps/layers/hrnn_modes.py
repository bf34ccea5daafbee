"""The training modes of ``seqapps.layers.hierarchical_rnn.DecoupledHRNN``, importable without TensorFlow.

The layer checks its ``mode`` against them, and ``seqapps.config.HRNNConfig`` validates a
config's ``mode`` with them before TensorFlow is imported.
"""

#: "hrnn" (true gradients), "gr_hrnn" (restricted gradients, no decoders), "decoupled" (restricted
#: gradients plus the decoders' local losses), "mr_hrnn" (true gradients truncated to decoupled's memory).
MODES = ("hrnn", "gr_hrnn", "decoupled", "mr_hrnn")
