"""Tests of the character n-gram model (seqapps.layers.ngram_lm) and the CTC beam search that reads it
(``ctc.ctc_lm_beam_decode``), against a dictionary Witten-Bell model and brute force over every frame path."""
import collections
import itertools
import math

import numpy as np
import pytest
import tensorflow as tf

from seqapps.layers import ctc, ngram_lm

CHARS = ["", " ", "a", "b"]  # class 0 the blank, 1 the space
TEXTS = ["ab a", "ba", "a b ab", "bb", "a"]
START, END = "^", "$"


def witten_bell(texts, order):
    """P(symbol | history) by interpolated Witten-Bell from dictionaries of counts (the reference)."""
    counts = collections.defaultdict(collections.Counter)
    for text in texts:
        padded = START * (order - 1) + text + END
        for i in range(order - 1, len(padded)):
            for n in range(order):
                counts[padded[i - n:i]][padded[i]] += 1
    symbols = [*CHARS[1:], END]

    def prob(history, symbol):
        history = (START * (order - 1) + history)[len(history):] if order > 1 else ""
        p = 1.0 / len(symbols)
        for n in range(order):
            seen = counts.get(history[len(history) - n:] if n else "")
            if seen:
                total, types = sum(seen.values()), len(seen)
                p = (seen[symbol] + types * p) / (total + types)
        return p
    return prob, symbols


def context_of(lm, history):
    context = tf.zeros([], tf.int64)
    for c in history:
        context = lm.next_context(context, tf.constant(CHARS.index(c), tf.int64))
    return context


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_next_log_probs_equal_a_dictionary_witten_bell_model(order):
    lm = ngram_lm.CharNgramLM(TEXTS, CHARS, order)
    reference, symbols = witten_bell(TEXTS, order)
    histories = ["", "a", "ab", "b a", "bbb", "aaaa"]  # seen and unseen contexts, shorter and longer than n - 1
    got = lm.next_log_probs(tf.stack([context_of(lm, h) for h in histories])).numpy()
    assert got.shape == (len(histories), len(CHARS) + 1) and np.all(got[:, 0] == -np.inf)
    for row, history in zip(got, histories):
        expected = [math.log(reference(history, s)) for s in symbols]
        np.testing.assert_allclose(row[1:], expected, rtol=1e-5)  # float32 counts and sums
        assert np.exp(row[1:]).sum() == pytest.approx(1.0, abs=1e-5)


def test_without_text_every_symbol_is_equally_likely_and_bad_input_is_refused():
    lm = ngram_lm.CharNgramLM([], CHARS, 3)
    np.testing.assert_allclose(np.exp(lm.next_log_probs(tf.constant([0, 7], tf.int64)).numpy()[:, 1:]), 0.25)
    with pytest.raises(ValueError, match="outside the characters"):
        ngram_lm.CharNgramLM(["abc"], CHARS, 2)
    with pytest.raises(ValueError, match="order 0"):
        ngram_lm.CharNgramLM(TEXTS, CHARS, 0)
    assert 29 ** 11 * 16 < 2 ** 62 <= 29 ** 12 * 16 and ngram_lm.max_order(28) == 11  # keys are int64
    assert ngram_lm.max_order(3) == ngram_lm.MAX_ORDER


def normalised(labels):
    """A labelling in the decoder's form: no leading space, no two spaces in a row."""
    out = []
    for c in labels:
        if c == 1 and (not out or out[-1] == 1):
            continue
        out.append(c)
    return tuple(out)


def brute_force_best(log_probs, prob, weight, bonus):
    """The best transcript over every frame path: CTC probability, plus the weighted LM and the length bonus."""
    totals = collections.defaultdict(float)
    for path in itertools.product(range(log_probs.shape[1]), repeat=log_probs.shape[0]):
        labels = normalised(c for c, _ in itertools.groupby(path) if c != 0)
        totals[labels] += math.exp(sum(log_probs[t, c] for t, c in enumerate(path)))

    def score(labels):
        text = "".join(CHARS[c] for c in labels)
        lm = sum(math.log(prob(text[:i], ch)) for i, ch in enumerate(text)) + math.log(prob(text, END))
        return math.log(totals[labels]) + weight * lm + bonus * len(labels)
    best = max(totals, key=score)
    return best, score(best)


@pytest.mark.parametrize("weight,bonus", [(0.0, 0.0), (1.0, 0.0), (2.0, 1.5)])
def test_beam_search_with_every_prefix_kept_finds_the_brute_force_best(weight, bonus):
    frames = 5
    lm = ngram_lm.CharNgramLM(TEXTS, CHARS, 2)
    prob, _ = witten_bell(TEXTS, 2)
    logits = np.random.default_rng(3).normal(size=(4, frames, len(CHARS))).astype(np.float32) * 2.0
    lengths = np.array([5, 4, 5, 3], np.int32)
    ids, scores = ctc.ctc_lm_beam_decode(logits, lengths, lm, 128, weight, bonus, space_id=1)
    for row, length in enumerate(lengths):  # 3 + 9 + ... + 243 prefixes at most: 128 beams prune none that win
        log_probs = logits[row, :length] - np.log(np.exp(logits[row, :length]).sum(-1, keepdims=True))
        best, score = brute_force_best(log_probs.astype(np.float64), prob, weight, bonus)
        assert tuple(ids[row].numpy()) == best
        assert scores[row].numpy() == pytest.approx(score, abs=1e-4)


def test_each_row_is_decoded_as_it_would_be_alone():
    lm = ngram_lm.CharNgramLM(TEXTS, CHARS, 3)
    logits = np.random.default_rng(5).normal(size=(3, 7, len(CHARS))).astype(np.float32) * 3.0
    lengths = np.array([7, 2, 5], np.int32)
    together, scores = ctc.ctc_lm_beam_decode(logits, lengths, lm, 4, 0.8, 1.0, space_id=1)
    for row, length in enumerate(lengths):
        alone, score = ctc.ctc_lm_beam_decode(logits[row:row + 1, :length], lengths[row:row + 1], lm, 4, 0.8, 1.0,
                                              space_id=1)
        assert together[row].numpy().tolist() == alone[0].numpy().tolist()
        assert scores[row].numpy() == pytest.approx(score[0].numpy(), abs=1e-5)


@pytest.mark.parametrize("signature", [
    (tf.TensorSpec([1, 6, len(CHARS)], tf.float32), tf.TensorSpec([1], tf.int32)),  # a batch of one, known
    (tf.TensorSpec([None, None, len(CHARS)], tf.float32), tf.TensorSpec([None], tf.int32))])
def test_a_traced_search_equals_the_eager_one_whatever_the_graph_knows_of_the_shapes(signature):
    lm = ngram_lm.CharNgramLM(TEXTS, CHARS, 3)
    logits = np.random.default_rng(7).normal(size=(1, 6, len(CHARS))).astype(np.float32) * 3.0
    traced = tf.function(lambda x, n: ctc.ctc_lm_beam_decode(x, n, lm, 4, 0.8, 1.0, space_id=1),
                         input_signature=signature)
    (ids, score), (eager_ids, eager_score) = traced(logits, [6]), ctc.ctc_lm_beam_decode(logits, [6], lm, 4, 0.8,
                                                                                        1.0, space_id=1)
    assert ids.to_list() == eager_ids.to_list() and score.numpy() == pytest.approx(eager_score.numpy())


def test_no_frames_decode_to_nothing_with_the_score_of_an_empty_sentence():
    lm = ngram_lm.CharNgramLM(TEXTS, CHARS, 3)
    traced = tf.function(lambda x, n: ctc.ctc_lm_beam_decode(x, n, lm, 4, 0.8, 1.0, space_id=1),
                         input_signature=(tf.TensorSpec([None, None, len(CHARS)], tf.float32),
                                          tf.TensorSpec([None], tf.int32)))
    empty = 0.8 * lm.next_log_probs(tf.constant([0], tf.int64))[0, lm.end].numpy()  # log P(end | start)
    logits = np.random.default_rng(3).normal(size=(2, 4, len(CHARS))).astype(np.float32)
    for frames, lengths in ((logits[:, :0], [0, 0]), (logits, [0, 4])):  # a batch without frames; a row without
        ids, scores = traced(frames, lengths)
        assert ids[0].numpy().tolist() == [] and scores[0].numpy() == pytest.approx(empty)
        assert ids.nrows() == 2


def test_the_language_model_corrects_an_ambiguous_frame_toward_the_training_text():
    # "ab" then a frame that is 55:45 "a" against "b": the texts say "b" follows "a" ... "a b" more often
    lm = ngram_lm.CharNgramLM(["ab ab ab", "ab ab"], CHARS, 3)
    frames = np.log(np.array([[0.01, 0.01, 0.97, 0.01], [0.01, 0.01, 0.53, 0.45]], np.float32))
    logits = frames[None]
    plain, _ = ctc.ctc_lm_beam_decode(logits, [2], lm, 8, 0.0, 0.0, space_id=1)
    fused, _ = ctc.ctc_lm_beam_decode(logits, [2], lm, 8, 1.0, 0.0, space_id=1)
    assert "".join(CHARS[c] for c in plain[0].numpy()) == "a"  # "aa" collapses: the acoustics alone say "a"
    assert "".join(CHARS[c] for c in fused[0].numpy()) == "ab"
