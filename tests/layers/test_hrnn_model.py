"""HRNNSequenceModel: the shared harness, with its own lean-gradient train_step in the fit check."""
import keras
import numpy as np

from seqapps.layers.hierarchical_rnn import DecoupledHRNN
from seqapps.layers.hrnn_model import HRNNSequenceModel
from tests.layers.harness import run_layer_test


def test_hrnn_sequence_model_passes_the_layer_harness():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 5, size=(3, 8)).astype("int32")
    targets = np.stack([rng.integers(0, 4, size=(3, 8)), np.ones((3, 8))], axis=-1).astype("float32")
    hrnn = DecoupledHRNN([keras.layers.GRUCell(6), keras.layers.GRUCell(4)], periods=2, aux_hidden_units=5,
                         aux_loss="categorical_crossentropy", output_units=4, seed=3)
    run_layer_test(HRNNSequenceModel, {"hrnn": hrnn, "one_hot_depth": 5, "boundary_ids": [0]}, ids,
                   expected_output_shape=(3, 8, 4),
                   expected_num_trainable_weights=12,  # two GRUs 6, the decoder's two Dense 4, the head 2
                   expected_num_non_trainable_weights=0, other_input_data=ids[:2, :5], training_target=targets,
                   atol=1e-5)
