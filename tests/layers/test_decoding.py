"""Tests of seqapps.layers.decoding against brute-force enumeration of every sequence."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

from seqapps.layers import decoding
from tests.export_harness import call_in_tensorflow_only_process

END = 0


def second_order_step(logits_table: np.ndarray):
    """A step function whose next-token logits depend on the last two tokens: the one fed and the
    one before it, which is the state. Wrong state reordering in beam search would change its results."""
    table = tf.constant(logits_table, tf.float32)

    def step_fn(ids, state, step):
        return tf.gather_nd(table, tf.stack([state["before"], ids], axis=1)), {"before": ids}

    return step_fn


def log_softmax(x: np.ndarray) -> np.ndarray:
    return x - np.log(np.sum(np.exp(x - x.max(-1, keepdims=True)), -1, keepdims=True)) - x.max(-1, keepdims=True)


def enumerate_sequences(logits_table: np.ndarray, start: int, before: int, max_length: int, alpha: float):
    """Every sequence the decoders can return (ended at the first END, or max_length long), with its
    summed log-probability and GNMT-normalised score, best first. Length counts the END token."""
    log_probs = log_softmax(logits_table.astype(np.float64))
    vocab = logits_table.shape[-1]
    found = []
    for length in range(1, max_length + 1):
        for tokens in itertools.product(range(vocab), repeat=length):
            if END in tokens[:-1] or (length < max_length and tokens[-1] != END):
                continue
            total, previous = 0.0, (before, start)
            for token in tokens:
                total += log_probs[previous[0], previous[1], token]
                previous = (previous[1], token)
            found.append((list(tokens), total, total / ((5 + length) / 6) ** alpha))
    return sorted(found, key=lambda item: -item[2])


def padded(tokens: list, width: int) -> list:
    return tokens + [END] * (width - len(tokens))


def random_table(seed: int, vocab: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 2, (vocab, vocab, vocab)).astype("float32")


def trap_table() -> np.ndarray:
    """Tokens 0=end, 1=a, 2=b, 3=start. After start: a 0.55, b 0.43; after a: end 0.34 at best;
    after b: end 0.9. Greedy takes a, end (0.187); the likeliest sequence is b, end (0.387)."""
    probs = np.array([[0.97, 0.01, 0.01, 0.01],   # after end
                      [0.34, 0.33, 0.32, 0.01],   # after a
                      [0.90, 0.04, 0.05, 0.01],   # after b
                      [0.01, 0.55, 0.43, 0.01]])  # after start
    return np.log(np.broadcast_to(probs, (4, 4, 4))).astype("float32")  # the token before does not matter


def start_state(starts: list[int]):
    return tf.constant(starts, tf.int32), {"before": tf.constant(starts, tf.int32)}


def test_beam_search_finds_the_likeliest_sequence_that_greedy_misses():
    table = trap_table()
    step_fn = second_order_step(table)
    start_ids, state = start_state([3])
    best = enumerate_sequences(table, 3, 3, 3, alpha=0.0)[0]
    assert best[0] == [2, END] and best[1] == pytest.approx(np.log(0.43 * 0.9), abs=1e-6)

    greedy_ids, greedy_log_probs = decoding.greedy_search(step_fn, start_ids, state, 3, END)
    assert greedy_ids.numpy().tolist() == [[1, END]]
    assert greedy_log_probs.numpy()[0] == pytest.approx(np.log(0.55 * 0.34), abs=1e-5)
    assert np.log(0.55 * 0.34) < best[1]

    beam_ids, scores = decoding.beam_search(step_fn, start_ids, state, 2, 3, END)
    assert beam_ids.numpy()[0, 0].tolist() == [2, END]
    assert scores.numpy()[0, 0] == pytest.approx(best[1], abs=1e-5)  # float32 sums of 2 log-probs


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_a_beam_wide_enough_for_every_hypothesis_returns_the_brute_force_ranking(alpha):
    """V=4 (3 non-end tokens), max_length 3: 1 + 3 + 9 + 27 = 40 sequences, so 40 beams prune nothing."""
    table = random_table(0)
    step_fn = second_order_step(table)
    starts = [1, 3]
    start_ids, state = start_state(starts)
    ids, scores = decoding.beam_search(step_fn, start_ids, state, 40, 3, END, length_penalty=alpha)
    assert ids.shape == (2, 40, 3) and scores.shape == (2, 40)
    for row, start in enumerate(starts):
        expected = enumerate_sequences(table, start, start, 3, alpha)
        assert len(expected) == 40
        # float32 sums of <= 3 log-probabilities of size ~10: 1e-4 is ~100 ulps
        np.testing.assert_allclose(scores.numpy()[row], [score for _, _, score in expected], atol=1e-4)
        returned = sorted(map(tuple, ids.numpy()[row].tolist()))
        assert returned == sorted(tuple(padded(tokens, 3)) for tokens, _, _ in expected)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_small_beams_hold_the_best_hypotheses_found_with_their_brute_force_scores(alpha):
    table = random_table(1, vocab=5)
    step_fn = second_order_step(table)
    start_ids, state = start_state([2, 4, 1])
    ids, scores = decoding.beam_search(step_fn, start_ids, state, 3, 4, END, length_penalty=alpha)
    for row, start in enumerate([2, 4, 1]):
        enumerated = enumerate_sequences(table, start, start, 4, alpha)
        truth = {tuple(padded(tokens, 4)): score for tokens, _, score in enumerated}
        width = ids.shape[-1]
        for beam, score in zip(ids.numpy()[row].tolist(), scores.numpy()[row]):
            assert truth[tuple(padded(beam, 4))[:4]] == pytest.approx(score, abs=1e-4)  # each beam scored right
            assert len(beam) == width
        assert list(scores.numpy()[row]) == sorted(scores.numpy()[row], reverse=True)  # best first
    top = [enumerate_sequences(table, s, s, 4, alpha)[0][2] for s in (2, 4, 1)]
    # the beam's best never beats the true best; on this table it finds it
    np.testing.assert_allclose(scores.numpy()[:, 0], top, atol=1e-4)


def test_length_counts_the_end_token():
    """a then end, each with probability 1/2: score = log(1/4) / ((5 + 2) / 6) ** alpha (length 2)."""
    probs = np.full((3, 3, 3), 1e-9)
    probs[:, 2, :] = [1e-9, 0.5, 0.5 - 1e-9]  # after start (2): a (1) or start again
    probs[:, 1, :] = [0.5, 0.5 - 1e-9, 1e-9]  # after a: end or a
    probs[:, 0, :] = [1.0, 1e-9, 1e-9]
    step_fn = second_order_step(np.log(probs).astype("float32"))
    start_ids, state = start_state([2])
    ids, scores = decoding.beam_search(step_fn, start_ids, state, 1, 2, END, length_penalty=1.0)
    assert ids.numpy().tolist() == [[[1, END]]]
    assert scores.numpy()[0, 0] == pytest.approx(np.log(0.25) / (7 / 6), rel=1e-5)


def test_finished_hypotheses_are_kept_padded_and_not_extended():
    table = random_table(2)
    table[:, :, END] += 3.0  # ending is likely: most hypotheses finish early
    step_fn = second_order_step(table)
    start_ids, state = start_state([1, 2])
    ids, scores = decoding.beam_search(step_fn, start_ids, state, 4, 6, END, length_penalty=0.5)
    for row in ids.numpy():
        for beam in row.tolist():
            if END in beam:
                assert set(beam[beam.index(END):]) == {END}
    truth = {tuple(padded(t, 6)): s for t, _, s in enumerate_sequences(table, 1, 1, 6, 0.5)}
    for beam, score in zip(ids.numpy()[0].tolist(), scores.numpy()[0]):
        assert truth[tuple(padded(beam, 6))] == pytest.approx(score, abs=1e-4)  # not extended past END
    assert sum(END in beam for beam in ids.numpy()[0].tolist()) >= 2  # the test does exercise finished beams


def test_the_loop_stops_when_every_sequence_has_ended():
    table = np.full((3, 3, 3), -10.0, np.float32)
    table[:, :, END] = 10.0
    step_fn = second_order_step(table)
    start_ids, state = start_state([1, 2])
    greedy_ids, _ = decoding.greedy_search(step_fn, start_ids, state, 50, END)
    beam_ids, _ = decoding.beam_search(step_fn, start_ids, state, 2, 50, END)
    assert greedy_ids.numpy().tolist() == [[END], [END]]
    assert beam_ids.shape == (2, 2, 2)  # the second beam's best needs 2 steps: a non-end token, then END


@pytest.mark.parametrize("seed", [3, 4])
def test_beam_size_one_equals_greedy(seed):
    table = random_table(seed, vocab=6)
    step_fn = second_order_step(table)
    start_ids, state = start_state([1, 2, 3, 4, 5])
    greedy_ids, greedy_log_probs = decoding.greedy_search(step_fn, start_ids, state, 7, END)
    beam_ids, scores = decoding.beam_search(step_fn, start_ids, state, 1, 7, END)
    np.testing.assert_array_equal(beam_ids.numpy()[:, 0], greedy_ids.numpy())
    np.testing.assert_allclose(scores.numpy()[:, 0], greedy_log_probs.numpy(), atol=1e-5)


def test_greedy_log_probs_and_padding_match_brute_force():
    table = random_table(5)
    step_fn = second_order_step(table)
    ids, log_probs = decoding.greedy_search(step_fn, *start_state([1, 3]), 5, END)
    for row, start in enumerate([1, 3]):
        tokens = ids.numpy()[row].tolist()
        cut = tokens[: tokens.index(END) + 1] if END in tokens else tokens
        assert tokens == padded(cut, ids.shape[1])
        scored = {tuple(t): lp for t, lp, _ in enumerate_sequences(table, start, start, 5, 0.0)}
        assert log_probs.numpy()[row] == pytest.approx(scored[tuple(cut)], abs=1e-4)


def test_sampling_with_top_k_1_or_temperature_0_equals_greedy():
    table = random_table(6, vocab=6)
    step_fn = second_order_step(table)
    start = start_state([1, 2, 3, 4, 5])
    greedy_ids, greedy_log_probs = decoding.greedy_search(step_fn, *start, 8, END)
    for kwargs in ({"top_k": 1, "seed": 1}, {"top_k": 1}, {"temperature": 0.0}, {"temperature": [0.0] * 5}):
        ids, log_probs = decoding.sample(step_fn, *start, 8, END, **kwargs)
        np.testing.assert_array_equal(ids.numpy(), greedy_ids.numpy())
        np.testing.assert_allclose(log_probs.numpy(), greedy_log_probs.numpy(), atol=1e-6)


def constant_step(probs: list[float]):
    logits = tf.math.log(tf.constant([probs], tf.float32))

    def step_fn(ids, state, step):
        return tf.repeat(logits, tf.shape(ids)[0], axis=0), state

    return step_fn


ROWS = 4000  # draws per check: a frequency's standard error is at most sqrt(0.25 / 4000) = 0.0079


def first_token_frequencies(probs: list[float], seed: int, **kwargs) -> np.ndarray:
    ids, _ = decoding.sample(constant_step(probs), tf.zeros([ROWS], tf.int32), (), 1, -1, seed=seed, **kwargs)
    return np.bincount(ids.numpy()[:, 0], minlength=len(probs)) / ROWS


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_top_p_samples_the_renormalised_nucleus(seed):
    probs = [0.5, 0.3, 0.15, 0.05]
    found = first_token_frequencies(probs, seed, top_p=0.7)  # 0.5 < 0.7 <= 0.8: the nucleus is {0, 1}
    assert found[2] == 0 and found[3] == 0
    np.testing.assert_allclose(found[:2], [0.5 / 0.8, 0.3 / 0.8], atol=0.03)  # ~4 standard errors


@pytest.mark.parametrize("seed", [0, 1])
def test_temperature_and_top_k_sample_the_tempered_truncated_distribution(seed):
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    found = first_token_frequencies(list(probs), seed, temperature=2.0, top_k=3)
    tempered = np.sqrt(probs[:3]) / np.sqrt(probs[:3]).sum()  # p ** (1 / T), T = 2, top 3 renormalised
    assert found[3] == 0
    np.testing.assert_allclose(found[:3], tempered, atol=0.03)  # ~4 standard errors
    unrestricted = first_token_frequencies(list(probs), seed)
    np.testing.assert_allclose(unrestricted, probs, atol=0.03)


def test_per_row_settings_and_seeds():
    step_fn = constant_step([0.4, 0.35, 0.25])
    start = tf.zeros([6], tf.int32)
    ids, _ = decoding.sample(step_fn, start, (), 20, -1, temperature=[0, 1, 0, 1, 0, 1], top_k=[0, 1, 0, 0, 0, 2],
                             seed=9)
    ids = ids.numpy()
    assert ids.shape == (6, 20)
    assert np.all(ids[[0, 2, 4]] == 0) and np.all(ids[1] == 0)  # greedy rows; top_k=1 row
    assert set(ids[5].tolist()) <= {0, 1} and len(set(ids[3].tolist())) == 3
    again, _ = decoding.sample(step_fn, start, (), 20, -1, temperature=[0, 1, 0, 1, 0, 1],
                               top_k=[0, 1, 0, 0, 0, 2], seed=9)
    other, _ = decoding.sample(step_fn, start, (), 20, -1, temperature=[0, 1, 0, 1, 0, 1],
                               top_k=[0, 1, 0, 0, 0, 2], seed=10)
    np.testing.assert_array_equal(again.numpy(), ids)
    assert not np.array_equal(other.numpy(), ids)


def test_advance_feeds_each_row_its_own_prompt_length():
    def step_fn(ids, state, step):  # the state sums the fed ids
        return tf.zeros([tf.shape(ids)[0], 2]), state + ids

    state = decoding.advance(step_fn, tf.constant([[1, 2, 3], [4, 5, 6], [7, 8, 9]]), tf.constant([3, 1, 0]),
                             tf.zeros([3], tf.int32))
    assert state.numpy().tolist() == [6, 4, 0]


def test_bad_beam_arguments_are_rejected():
    step_fn = second_order_step(random_table(0))
    with pytest.raises(ValueError, match="beam_size must be an integer >= 1"):
        decoding.beam_search(step_fn, *start_state([1]), 0, 3, END)
    with pytest.raises(ValueError, match="length_penalty must be >= 0"):
        decoding.beam_search(step_fn, *start_state([1]), 2, 3, END, length_penalty=-1.0)


class Decoders(tf.Module):
    """The three decoders behind tf.functions whose max_length is a tensor input."""

    def __init__(self, table: np.ndarray):
        super().__init__()
        self.table = tf.Variable(table)

    def step(self, ids, state, step):
        return tf.gather_nd(self.table, tf.stack([state["before"], ids], axis=1)), {"before": ids}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32)])
    def greedy(self, start_ids, max_length):
        ids, log_probs = decoding.greedy_search(self.step, start_ids, {"before": start_ids}, max_length, END)
        return {"ids": ids, "log_probs": log_probs}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32),
                                  tf.TensorSpec([None], tf.float32)])
    def sampled(self, start_ids, max_length, temperature):
        ids, log_probs = decoding.sample(self.step, start_ids, {"before": start_ids}, max_length, END,
                                         temperature=temperature, top_k=3, top_p=0.9, seed=5)
        return {"ids": ids, "log_probs": log_probs}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32)])
    def beam(self, start_ids, max_length):
        ids, scores = decoding.beam_search(self.step, start_ids, {"before": start_ids}, 3, max_length, END,
                                           length_penalty=0.6)
        return {"ids": ids, "scores": scores}


def test_decoders_run_from_a_saved_model_in_a_tensorflow_only_process(tmp_path):
    module = Decoders(random_table(7, vocab=5))
    signatures = {"greedy": module.greedy, "sampled": module.sampled, "beam": module.beam}
    tf.saved_model.save(module, str(tmp_path / "decoders"), signatures=signatures)
    starts, temperatures = np.array([1, 2, 3], "int32"), np.array([0.0, 1.0, 0.7], "float32")
    length, short = np.array(6, "int32"), np.array(2, "int32")  # max_length is a tensor input
    expected = {"greedy": module.greedy(starts, length), "sampled": module.sampled(starts, length, temperatures),
                "beam": module.beam(starts, length)}
    calls = [("greedy", {"start_ids": starts, "max_length": length}),
             ("sampled", {"start_ids": starts, "max_length": length, "temperature": temperatures}),
             ("beam", {"start_ids": starts, "max_length": length}),
             ("greedy", {"start_ids": starts, "max_length": short})]
    answer = call_in_tensorflow_only_process(tmp_path / "decoders", calls)
    assert answer["imported"] == []
    for (name, _), served in zip(calls[:3], answer["outputs"]):
        for key, value in expected[name].items():
            np.testing.assert_allclose(served[key], value.numpy(), atol=1e-6)
    assert answer["outputs"][3]["ids"].shape[1] <= 2
    assert answer["outputs"][2]["ids"].shape[:2] == (3, 3)
