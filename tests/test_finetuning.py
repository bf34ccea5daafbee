"""Tests of seqapps.finetuning: vocabulary growth at fine-tuning, against NumPy references."""
import keras
import numpy as np
import pytest

from seqapps.errors import ConfigError
from seqapps.finetuning import VocabularyMap, grow_vocabulary, transfer_weights, vocabulary_report
from seqapps.layers.batch_nce import BatchNCE, full_logits, unigram_distribution
from seqapps.layers.lexicon import LexiconBias

OLD_WORDS = ["<unk>", "a", "b", "c", "d"]
NEW_WORDS = ["<unk>", "c", "a", "x", "d", "y"]  # b left, c and a moved, x and y added
OLD_TAGS, NEW_TAGS = ["rock", "jazz", "folk"], ["rock", "jazz", "folk", "blues", "pop"]
HIDDEN, TOP_K = 6, 2


def _tagger(words: list[str], tags: list[str]) -> keras.Model:
    """Word ids -> mean embedding -> one Dense score per tag."""
    ids = keras.Input((None,), dtype="int32")
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(len(words), 4, name="embedding")(ids))
    return keras.Model(ids, keras.layers.Dense(len(tags), name="scores")(pooled))


def _values(model: keras.Model) -> dict[str, np.ndarray]:
    return {weight.path: keras.ops.convert_to_numpy(weight).copy() for weight in model.weights}


def _randomise(model: keras.Model, seed: int) -> None:
    """Every float weight to random values (a trained model's: the zero Dense bias too)."""
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        if weight.dtype.startswith("float"):
            weight.assign(rng.normal(size=weight.shape).astype("float32"))


def test_vocabulary_map_from_tokens_places_and_renumbers():
    mapping = VocabularyMap.from_tokens(OLD_WORDS, NEW_WORDS)
    assert mapping.old_ids.tolist() == [0, 3, 1, -1, 4, -1]
    assert mapping.added.tolist() == [3, 5] and mapping.new_size == 6
    old, fresh = np.arange(10.0).reshape(5, 2), -np.ones((6, 2))
    np.testing.assert_array_equal(mapping.place(old, fresh, 0), [[0, 1], [6, 7], [2, 3], [-1, -1], [8, 9], [-1, -1]])
    np.testing.assert_array_equal(mapping.place(old.T, fresh.T, 1), mapping.place(old, fresh, 0).T)
    assert mapping.renumber(np.array([[1, 2], [3, 4]], "int32")).tolist() == [[2, 0], [1, 4]]  # b -> <unk>
    assert VocabularyMap.from_tokens(OLD_WORDS, OLD_WORDS).old_ids.tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="distinct ids"):
        VocabularyMap(np.array([0, 0]), 3)


def test_grow_vocabulary_appends_the_new_words_by_count_from_min_count_up_to_max_size():
    words = "x y a x z y x q".split()  # x 3, y 2, z 1, q 1; a is known
    assert grow_vocabulary(OLD_WORDS, words) == [*OLD_WORDS, "x", "y", "z", "q"]  # ties: first seen
    assert grow_vocabulary(OLD_WORDS, words, min_count=2) == [*OLD_WORDS, "x", "y"]
    assert grow_vocabulary(OLD_WORDS, words, max_size=6) == [*OLD_WORDS, "x"]
    assert grow_vocabulary(OLD_WORDS, words, max_size=3) == OLD_WORDS  # the export's words are never dropped
    assert vocabulary_report(5, [*OLD_WORDS, "x"], "x a w w".split()) == {"added": ["x"], "size": 6, "oov_rate": 0.5}
    assert vocabulary_report(5, OLD_WORDS, [])["oov_rate"] is None


def test_transfer_weights_moves_embedding_rows_and_dense_columns():
    keras.utils.set_random_seed(0)
    source, target = _tagger(OLD_WORDS, OLD_TAGS), _tagger(NEW_WORDS, NEW_TAGS)
    _randomise(source, 1)
    old, fresh = _values(source), _values(target)
    words, tags = VocabularyMap.from_tokens(OLD_WORDS, NEW_WORDS), VocabularyMap.from_tokens(OLD_TAGS, NEW_TAGS)
    transfer_weights(source, target, {"embedding": words, "scores": tags})
    new = _values(target)
    for i, j in enumerate(words.old_ids):  # rows: old ones moved, added ones as the layer initialised them
        expected = old["embedding/embeddings"][j] if j >= 0 else fresh["embedding/embeddings"][i]
        np.testing.assert_array_equal(new["embedding/embeddings"][i], expected)
    np.testing.assert_array_equal(new["scores/kernel"][:, :3], old["scores/kernel"])
    np.testing.assert_array_equal(new["scores/kernel"][:, 3:], fresh["scores/kernel"][:, 3:])
    np.testing.assert_array_equal(new["scores/bias"], np.r_[old["scores/bias"], 0.0, 0.0])  # Dense's zeros
    # the old tags' scores of a text of old words are the exported model's (NumPy: mean row @ kernel + bias)
    text = np.array([[1, 3, 4, 3]])
    reference = old["embedding/embeddings"][text].mean(axis=1) @ old["scores/kernel"] + old["scores/bias"]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(source(text)), reference, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(target(words.renumber(text)))[:, :3], reference,
                               rtol=1e-5, atol=1e-6)


def _output_model(words: list[str], counts: list[int]) -> tuple[keras.Model, BatchNCE]:
    hidden = keras.Input((HIDDEN,))
    output = BatchNCE(len(words), name="output")
    model = keras.Model(hidden, output(hidden))
    output.set_noise_distribution(unigram_distribution(counts))
    return model, output


def test_transfer_weights_grows_batch_nce_and_keeps_the_fresh_noise_distribution():
    keras.utils.set_random_seed(0)
    (source, old_layer), (target, new_layer) = _output_model(OLD_WORDS, [5, 4, 3, 2, 1]), \
        _output_model(NEW_WORDS, [1, 2, 3, 4, 5, 6])
    _randomise(source, 2)
    fresh_noise = keras.ops.convert_to_numpy(new_layer.noise_probs).copy()
    fresh_bias = keras.ops.convert_to_numpy(new_layer.bias).copy()
    words = VocabularyMap.from_tokens(OLD_WORDS, NEW_WORDS)
    transfer_weights(source, target, {"output": words})
    kept = words.old_ids >= 0
    for name in ("kernel", "bias"):
        old_value, new_value = (keras.ops.convert_to_numpy(getattr(layer, name)) for layer in (old_layer, new_layer))
        np.testing.assert_array_equal(new_value[kept], old_value[words.old_ids[kept]])
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(new_layer.bias)[~kept], fresh_bias[~kept])
    # the noise is the fine-tuning data's unigram, which B-NCE's batch noise follows
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(new_layer.noise_probs), fresh_noise)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(new_layer.noise_cdf), np.cumsum(fresh_noise), rtol=1e-6)
    hidden = np.random.default_rng(3).normal(size=(4, HIDDEN)).astype("float32")
    old_logits = hidden @ keras.ops.convert_to_numpy(old_layer.kernel).T + keras.ops.convert_to_numpy(old_layer.bias)
    new_logits = keras.ops.convert_to_numpy(full_logits(hidden, new_layer.kernel, new_layer.bias))
    np.testing.assert_allclose(new_logits[:, kept], old_logits[:, words.old_ids[kept]], rtol=1e-5, atol=1e-5)


def test_transfer_weights_renumbers_the_target_ids_of_a_lexicon_and_keeps_added_source_rows():
    sources_old, sources_new = ["<unk>", "uno", "dos"], ["<unk>", "dos", "uno", "tres"]
    attention, ids = keras.Input((None, None)), keras.Input((None,), dtype="int32")

    def lexicon_model(source_words: list[str], target_words: list[str]) -> tuple[keras.Model, LexiconBias]:
        layer = LexiconBias(len(source_words), len(target_words), TOP_K, name="lexicon")
        return keras.Model([attention, ids], layer({"attention": attention, "source_ids": ids})), layer

    (source, old_layer), (target, new_layer) = lexicon_model(sources_old, OLD_WORDS), lexicon_model(sources_new,
                                                                                                     NEW_WORDS)
    old_layer.set_table(np.array([[0, 0], [1, 2], [3, 4]]), np.array([[0, 0], [0.6, 0.4], [0.7, 0.2]]))
    new_layer.set_table(np.array([[0, 0], [2, 1], [1, 0], [3, 5]]), np.array([[0, 0], [0.5, 0.5], [0.9, 0.1],
                                                                               [0.8, 0.1]]))
    transfer_weights(source, target, {"lexicon": VocabularyMap.from_tokens(sources_old, sources_new)},
                     value_maps={"lexicon/table_ids": VocabularyMap.from_tokens(OLD_WORDS, NEW_WORDS)})
    # dos (old row 2: c, d) -> new row 1 as new ids (1, 4); uno (a, b) -> row 2 as (2, <unk>); tres keeps its row
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(new_layer.table_ids), [[0, 0], [1, 4], [2, 0], [3, 5]])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(new_layer.table_probs),
                               [[0, 0], [0.7, 0.2], [0.6, 0.4], [0.8, 0.1]], rtol=1e-6)


def test_transfer_weights_refuses_another_architecture_and_unexplained_shapes():
    source = _tagger(OLD_WORDS, OLD_TAGS)
    with pytest.raises(ConfigError, match="no vocabulary map explains it"):
        transfer_weights(source, _tagger(NEW_WORDS, OLD_TAGS), {})
    with pytest.raises(ValueError, match="no layer 'output'"):
        transfer_weights(source, _tagger(OLD_WORDS, OLD_TAGS), {"output": VocabularyMap(np.arange(3), 3)})
    ids = keras.Input((None,), dtype="int32")
    deeper = keras.Model(ids, keras.layers.Dense(3)(keras.layers.Dense(2)(
        keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(5, 4)(ids)))))
    with pytest.raises(ConfigError, match="exported architecture"):
        transfer_weights(source, deeper, {})
    normed = keras.Model(ids, keras.layers.LayerNormalization(name="norm")(keras.layers.Embedding(5, 4)(ids)))
    with pytest.raises(ValueError, match="no weight a vocabulary indexes"):
        transfer_weights(normed, normed, {"norm": VocabularyMap(np.arange(4), 4)})


def _one_hot_reader(words: list[str]) -> tuple[keras.Model, keras.layers.LSTMCell]:
    """Word ids one-hot, then 3 other features after them, read by an LSTM cell; one score per word."""
    ids, other = keras.Input((None,), dtype="int32"), keras.Input((None, 3))
    cell = keras.layers.LSTMCell(4, name="cell")
    one_hot = keras.layers.Lambda(lambda x: keras.ops.one_hot(x, len(words)))(ids)
    hidden = keras.layers.RNN(cell, return_sequences=True, name="rnn")(keras.layers.Concatenate()([one_hot, other]))
    return keras.Model([ids, other], keras.layers.Dense(len(words), name="scores")(hidden)), cell


def test_transfer_weights_moves_the_rows_a_one_hot_vocabulary_indexes_in_a_cell_kernel():
    keras.utils.set_random_seed(0)
    (source, old_cell), (target, new_cell) = _one_hot_reader(OLD_WORDS), _one_hot_reader(NEW_WORDS)
    _randomise(source, 4)
    fresh_kernel = keras.ops.convert_to_numpy(new_cell.kernel).copy()
    words = VocabularyMap.from_tokens(OLD_WORDS, NEW_WORDS)
    transfer_weights(source, target, {new_cell.path: words, "scores": words})
    old_kernel, new_kernel = (keras.ops.convert_to_numpy(cell.kernel) for cell in (old_cell, new_cell))
    assert new_kernel.shape == (len(NEW_WORDS) + 3, 16)
    kept = np.flatnonzero(words.old_ids >= 0)
    np.testing.assert_array_equal(new_kernel[kept], old_kernel[words.old_ids[kept]])
    np.testing.assert_array_equal(new_kernel[words.added], fresh_kernel[words.added])
    np.testing.assert_array_equal(new_kernel[len(NEW_WORDS):], old_kernel[len(OLD_WORDS):])  # the other inputs' rows
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(new_cell.recurrent_kernel),
                                  keras.ops.convert_to_numpy(old_cell.recurrent_kernel))
    # old words in, old words' scores out: what the exported model computes
    text, other = np.array([[1, 3, 4, 3]]), np.random.default_rng(5).normal(size=(1, 4, 3)).astype("float32")
    old_scores = keras.ops.convert_to_numpy(source([text, other]))
    new_scores = keras.ops.convert_to_numpy(target([words.renumber(text), other]))
    np.testing.assert_allclose(new_scores[..., kept], old_scores[..., words.old_ids[kept]], rtol=1e-5, atol=1e-6)
