"""Tests of the shared sequence-to-sequence generator (seqapps.generation).

A decoding method added to the library's registry is one class: top-p (nucleus) sampling, written
here, is exported by translation and captioning through their signatures with no change to either
pipeline module. Attention is collected while decoding and equals the teacher-forced attention of
the decoded words.
"""
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from pipelines import image_captioning, translation
from seqapps import generation
from seqapps.config import SEQ2SEQ_ATTENTIONS, SEQ2SEQ_CELLS, resolve_config
from seqapps.data import text as text_data
from seqapps.errors import ConfigError
from seqapps.export import write_export
from seqapps.layers import attention_decoder, decoding
from seqapps.layers.batch_nce import BatchNCE
from tests.export_harness import call_in_tensorflow_only_process, decoded

SEED = 7


class TopPSampling(decoding.DecodingStrategy):
    """Nucleus sampling (Holtzman et al. 2020): draws from the smallest set of likeliest tokens whose
    probability reaches each request row's ``top_p``, renormalised; stateless draws seeded by ``SEED``."""

    request_inputs = {"top_p": (tf.float32, 0.9)}

    def __init__(self, top_p: tf.Tensor) -> None:
        self.top_p = top_p

    @classmethod
    def from_request(cls, settings, inputs):
        return cls(inputs["top_p"])

    def step(self, step, logits, log_probs, totals, lengths, finished):
        logits = logits[:, 0, :]
        ordered = tf.sort(logits, axis=-1, direction="DESCENDING")
        before = tf.cumsum(tf.nn.softmax(ordered), axis=-1, exclusive=True)  # the mass ahead of each token
        kept = tf.maximum(tf.reduce_sum(tf.cast(before < self.top_p[:, None], tf.int32), axis=-1), 1)
        kept = tf.where(self.top_p >= 1.0, tf.shape(logits)[-1], kept)
        threshold = tf.gather(ordered, kept - 1, batch_dims=1)
        nucleus = tf.where(logits < threshold[:, None], float("-inf"), logits)
        drawn = tf.random.stateless_categorical(nucleus, 1, seed=tf.stack([tf.constant(SEED), step]),
                                                dtype=tf.int32)
        end_or_drawn = tf.where(finished, tf.argmax(log_probs, axis=-1, output_type=tf.int32), drawn)
        return tf.zeros_like(end_or_drawn), end_or_drawn


class SeededSampling(decoding.Sampling):
    """The reference: the library's plain sampling, drawing with the seed ``TopPSampling`` draws with."""

    @classmethod
    def from_request(cls, settings, inputs):
        return cls(seed=SEED)


def test_top_p_sampling_draws_the_renormalised_nucleus():
    probs = np.array([0.5, 0.3, 0.15, 0.05])  # 0.5 < 0.7 <= 0.8: the nucleus of p = 0.7 is {0, 1}
    rows = 4000  # a frequency's standard error is at most sqrt(0.25 / 4000) = 0.008

    def step_fn(ids, state, step):
        return tf.repeat(tf.math.log(tf.constant(probs, tf.float32))[None], tf.shape(ids)[0], axis=0), state

    found = decoding.dynamic_decode(step_fn, TopPSampling(tf.fill([rows], 0.7)), tf.zeros([rows], tf.int32), (),
                                    1, -1)
    frequencies = np.bincount(found.ids.numpy()[:, 0, 0], minlength=4) / rows
    assert frequencies[2] == 0 and frequencies[3] == 0
    np.testing.assert_allclose(frequencies[:2], probs[:2] / probs[:2].sum(), atol=0.03)  # ~4 standard errors
    np.testing.assert_allclose(found.log_probs.numpy()[:, 0], np.log(probs)[found.ids.numpy()[:, 0, 0]], rtol=1e-5)


def tiny_translation():
    """Translation's tiny model, untrained, on 100 number phrases."""
    pipeline = translation.Translation()
    config = resolve_config(translation.TranslationConfig, "tiny", overrides=["num_pairs=100"])
    data = pipeline.load_data(config, None)
    texts = np.array(["three hundred and five", "", "twelve", "one thousand two"], dtype=object)
    return pipeline, config, data, {"text": texts}


def tiny_captioning():
    """Captioning's tiny model, untrained, on 24 generated scenes."""
    pipeline = image_captioning.ImageCaptioning()
    config = resolve_config(image_captioning.CaptioningConfig, "tiny",
                            overrides=["num_train=12", "num_val=4", "num_test=4", "num_novel=4"])
    data = pipeline.load_data(config, None)
    images = [image_captioning.image_data.read_image_bytes(path) for path in data.arrays["parts"]["test"].images]
    return pipeline, config, data, {"image_bytes": np.array(images, dtype=object)}


@pytest.mark.large  # two exports, each loaded in a TensorFlow-only process
@pytest.mark.parametrize("build, text, texts", [(tiny_translation, "translation", "translations"),
                                                (tiny_captioning, "caption", "captions")])
def test_a_strategy_class_in_the_registry_is_exported_by_both_pipelines(monkeypatch, tmp_path, build, text, texts):
    monkeypatch.setitem(generation.STRATEGIES, "top_p", TopPSampling)
    monkeypatch.setitem(generation.STRATEGIES, "sample", SeededSampling)
    pipeline, config, data, inputs = build()
    model = pipeline.build_model(config, data)
    module = pipeline.serving_module(model, config, data)
    assert set(module.signatures["top_p"].inputs) == {*inputs, "top_p"}
    export = write_export(module, tmp_path / pipeline.__class__.__name__, "config: {}\n", {}, data.state)
    rows = len(next(iter(inputs.values())))
    answer = call_in_tensorflow_only_process(export, [
        ("top_p", {**inputs, "top_p": np.full(rows, 1e-6, "float32")}), ("serving_default", inputs),
        ("top_p", {**inputs, "top_p": np.ones(rows, "float32")}), ("sample", inputs), ("beam", inputs)])
    assert answer["imported"] == []
    nucleus_of_one, greedy, whole, sampled, beam = answer["outputs"]
    assert set(greedy) == set(whole) == {text, "score"} and set(beam) == {texts, "scores"}
    # p -> 0 keeps the likeliest word alone: greedy search; p = 1 keeps every word: plain sampling, same seed
    assert decoded(nucleus_of_one[text]) == decoded(greedy[text])
    np.testing.assert_allclose(nucleus_of_one["score"], greedy["score"], rtol=1e-5, atol=1e-6)
    assert decoded(whole[text]) == decoded(sampled[text])
    np.testing.assert_allclose(whole["score"], sampled["score"], rtol=1e-5, atol=1e-6)
    # an untrained model's words are near uniform: sampling them is not the greedy answer
    assert decoded(whole[text]) != decoded(greedy[text])


@pytest.mark.parametrize("strategy", [decoding.GreedySearch(), decoding.BeamSearch(3, 0.6),
                                      decoding.Sampling(seed=3)])
def test_attention_collected_while_decoding_is_the_teacher_forced_attention_of_the_words(strategy):
    vocab, units, batch, memory_length = 9, 8, 2, 5
    rng = np.random.default_rng(0)
    decoder = attention_decoder.AttentionDecoder(vocab, 6, units, cell="gru", attention="bahdanau")
    output = BatchNCE(vocab, loss="softmax")
    memory = tf.constant(rng.normal(size=(batch, memory_length, units)), tf.float32)
    mask = tf.constant([[True] * 5, [True, True, True, False, False]])
    initial = [tf.constant(rng.normal(size=(batch, units)), tf.float32)]
    decoder({"ids": tf.zeros([batch, 1], tf.int32), "memory": memory, "memory_mask": mask, "state": initial})
    output(tf.zeros([batch, 1, units]))
    lookup = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(  # stands in for Vocabulary.lookup
        tf.range(vocab, dtype=tf.int64), tf.constant([f"w{i}" for i in range(vocab)])), "")
    generator = generation.Generator(decoder, output, lookup, None, start_id=2, end_id=1)
    state = {"rnn": initial, "memory": memory, "memory_mask": mask}
    found = generator.generate(state, strategy, 6, attention=True)
    hypotheses = found.ids.shape[1]
    ids = tf.reshape(found.ids, [batch * hypotheses, -1])
    given = tf.concat([tf.fill([batch * hypotheses, 1], 2), ids[:, :-1]], axis=1)  # <start> ids[:-1]
    repeat = lambda tensor: tf.repeat(tensor, hypotheses, axis=0)  # noqa: E731
    _, forced = decoder({"ids": given, "memory": repeat(memory), "memory_mask": repeat(mask),
                         "state": [repeat(initial[0])]}, return_attention=True)
    collected = tf.reshape(found.attention, [batch * hypotheses, ids.shape[1], memory_length]).numpy()
    real = generator.keep(ids).numpy() | (ids.numpy() == 1) & (np.cumsum(ids.numpy() == 1, axis=1) == 1)
    # the words up to the end token were fed as decoded: float32 steps vs one call agree to round-off
    np.testing.assert_allclose(collected[real], forced.numpy()[real], atol=1e-5)
    assert not collected[batch * hypotheses - 1, :, 3:].any()  # the second row's masked memory


def test_config_choices_name_what_the_layers_build():
    assert set(SEQ2SEQ_CELLS) == set(attention_decoder.CELLS)
    assert set(SEQ2SEQ_ATTENTIONS) == set(attention_decoder.ATTENTIONS)


@pytest.mark.parametrize("config_class, field, value, expected", [
    (translation.TranslationConfig, "attention", "none", "one of bahdanau, luong"),
    (image_captioning.CaptioningConfig, "cell", "rnn", "one of lstm, gru"),
    (translation.TranslationConfig, "beam_size", 0, "an integer >= 1"),
    (image_captioning.CaptioningConfig, "dropout", 1.0, "a number in [0, 1)"),
])
def test_the_shared_decoder_checks_apply_to_both_configs(config_class, field, value, expected):
    with pytest.raises(ConfigError, match=re.escape(f"config field '{field}': got {value!r}, expected {expected}")):
        resolve_config(config_class, "tiny", overrides=[f"{field}={value}"])


def test_beams_that_differ_only_in_length_penalty_share_one_trace_and_decode_as_alone():
    vocab, units, rows, memory_length = 9, 8, 6, 5
    rng = np.random.default_rng(SEED)
    keras.utils.set_random_seed(SEED)
    decoder = attention_decoder.AttentionDecoder(vocab, 6, units, cell="gru", attention="bahdanau")
    output = BatchNCE(vocab, loss="softmax")
    lookup = text_data.Vocabulary([text_data.UNKNOWN, *(f"w{i}" for i in range(1, vocab))], [0] * vocab).lookup()
    generator = generation.Generator(decoder, output, lookup, translation.TOKENIZER, start_id=2, end_id=1)

    def generate(memory: tf.Tensor, strategy: decoding.DecodingStrategy) -> generation.Generation:
        state = {"rnn": [tf.reduce_mean(memory, axis=1)], "memory": memory,
                 "memory_mask": tf.ones(tf.shape(memory)[:2], tf.bool)}
        found = generator.generate(state, strategy, 8)
        return generation.Generation(found, generator.words(found.ids))

    memories = rng.normal(size=(rows, memory_length, units)).astype(np.float32)
    beams = [decoding.BeamSearch(3, penalty) for penalty in (0.0, 0.6, 3.0)]
    functions = {}
    together = generation.generate_texts(generator, generate, [decoding.GreedySearch(), *beams], memories,
                                         batch_size=4, functions=functions)
    assert len(functions) == 2  # greedy search, and one for the three beams
    alone = [generation.generate_texts(generator, generate, [strategy], memories)[0]
             for strategy in [decoding.GreedySearch(), *beams]]
    assert together == alone
    assert together[1] != together[3], "the penalties decode alike: the test shows nothing"
