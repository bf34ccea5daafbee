"""Connectionist temporal classification: a speech model trained with CTC, and in-graph decoders.

Class ids: 0 is the CTC blank, ``1..C-1`` the characters. The decoders run in a
TensorFlow graph (core ops only), so exports hold them:

- ``ctc_greedy_decode``: the best path, repeats merged and blanks removed;
- ``ctc_beam_decode``: ``tf.nn.ctc_beam_search_decoder`` (which wants the blank
  last, so the classes are rotated);
- ``ctc_lm_beam_decode``: a prefix beam search that adds a character n-gram model's
  log-probabilities (``seqapps.layers.ngram_lm``), shallow fusion;
- ``ctc_word_spans``: each word of the greedy transcript with its start and end
  time and a confidence, read from the frame posteriors.

``CTCSpeechModel`` maps a padded waveform and its length to per-frame logits:
log-mel features (in the model, so training and serving compute the same ones),
per-utterance normalisation, time subsampling (a strided convolution, or frame
stacking), then a stack of bidirectional GRU/LSTM layers, a ``DecoupledHRNN`` or a ``BidirectionalHRNN``,
then logits over the characters and the blank. ``fit`` minimises
``tf.nn.ctc_loss``; with the HRNN encoder it trains in the layer's memory-lean mode.
``train_step`` alone augments the waveforms, and a training call the normalised log-mel
(``seqapps.layers.augment``), so neither evaluation nor an export sees the augmentation.
"""
from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from seqapps.layers.augment import (ALL_AUGMENTATIONS, AUGMENTATIONS, FEATURE_AUGMENTATIONS, VTLP_WARP,
                                    FeatureAugment, WaveformAugment)
from seqapps.layers.hierarchical_rnn import BidirectionalHRNN, DecoupledHRNN
from seqapps.layers.ngram_lm import CharNgramLM
from seqapps.layers.spectrogram import LogMelSpectrogram

BLANK = 0
ENCODERS = ("birnn", "hrnn", "bihrnn")
HRNN_ENCODERS = ("hrnn", "bihrnn")  # trained through the layer's memory-lean gradients
CELLS = {"gru": keras.layers.GRU, "lstm": keras.layers.LSTM}
CELL_TYPES = {"gru": keras.layers.GRUCell, "lstm": keras.layers.LSTMCell}


def ctc_loss(labels: tf.Tensor, logits: tf.Tensor, logit_lengths: tf.Tensor) -> tf.Tensor:
    """Per-example CTC negative log-likelihood.

    Args:
        labels: int [batch, L] class ids ``>= 1``, padded with 0.
        logits: float [batch, T, C].
        logit_lengths: int [batch] valid frames.

    Returns:
        float32 [batch] losses (nats).
    """
    labels = tf.cast(labels, tf.int32)
    label_lengths = tf.reduce_sum(tf.cast(labels > 0, tf.int32), axis=1)
    return tf.nn.ctc_loss(labels, tf.cast(logits, tf.float32), label_lengths, tf.cast(logit_lengths, tf.int32),
                          logits_time_major=False, blank_index=BLANK)


def ctc_greedy_decode(logits: tf.Tensor, lengths: tf.Tensor) -> tuple[tf.RaggedTensor, tf.Tensor]:
    """Best-path decoding.

    Args:
        logits: float [batch, T, C].
        lengths: int [batch] valid frames.

    Returns:
        ``(ids, scores)``: int32 ragged [batch, None] class ids (no blanks, repeats
        merged), and the best path's log-probability [batch].
    """
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
    best = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
    valid = tf.sequence_mask(lengths, tf.shape(best)[1])
    previous = tf.pad(best[:, :-1], [[0, 0], [1, 0]], constant_values=-1)
    keep = valid & (best != previous) & (best != BLANK)
    scores = tf.reduce_sum(tf.where(valid, tf.reduce_max(log_probs, axis=-1), 0.0), axis=1)
    return tf.ragged.boolean_mask(best, keep), scores


def ctc_beam_decode(logits: tf.Tensor, lengths: tf.Tensor, beam_width: int) -> tuple[tf.RaggedTensor, tf.Tensor]:
    """CTC beam search (``tf.nn.ctc_beam_search_decoder``), the best beam.

    Args:
        logits: float [batch, T, C].
        lengths: int [batch] valid frames.
        beam_width: beams kept.

    Returns:
        ``(ids, scores)``: int32 ragged [batch, None] class ids, and the beam's log-probability [batch].
    """
    rotated = tf.concat([logits[..., 1:], logits[..., :1]], axis=-1)  # the decoder's blank is the last class
    decoded, log_probs = tf.nn.ctc_beam_search_decoder(tf.transpose(tf.cast(rotated, tf.float32), [1, 0, 2]),
                                                       tf.cast(lengths, tf.int32), beam_width=beam_width, top_paths=1)
    sparse = decoded[0]
    batch = tf.shape(logits, out_type=tf.int64)[0]
    sparse = tf.SparseTensor(sparse.indices, tf.cast(sparse.values, tf.int32) + 1,
                             tf.stack([batch, tf.maximum(sparse.dense_shape[1], 0)]))
    return tf.RaggedTensor.from_sparse(sparse), log_probs[:, 0]


# two polynomial hashes of a prefix, each modulo a prime below 2**31 (so a product fits an int64): two prefixes
# that differ collide with a probability of about 2**-62
_PREFIX_HASHES = ((1_000_003, 2_147_483_647), (999_983, 2_147_483_629))


def _extend_hash(hashes: tf.Tensor, symbols: tf.Tensor) -> tf.Tensor:
    """The hashes [..., 2] of prefixes after ``symbols`` [...] follow them."""
    symbols = tf.cast(symbols, tf.int64)
    return tf.stack([(hashes[..., k] * base + symbols) % prime for k, (base, prime) in enumerate(_PREFIX_HASHES)],
                    axis=-1)


def _logaddexp(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """``log(exp(a) + exp(b))``, exact where either is ``-inf``."""
    high = tf.maximum(a, b)
    finite = tf.where(tf.math.is_finite(high), high, 0.0)
    return tf.where(tf.math.is_finite(high), finite + tf.math.log(tf.exp(a - finite) + tf.exp(b - finite)), high)


def ctc_lm_beam_decode(logits: tf.Tensor, lengths: tf.Tensor, lm: CharNgramLM, beam_width: int, lm_weight: float,
                       length_bonus: float, space_id: int) -> tuple[tf.RaggedTensor, tf.Tensor]:
    """CTC prefix beam search with a character language model (shallow fusion), in the graph.

    The prefix search of Graves & Jaitly (2014) and Hannun et al. (2014): each beam is a prefix with the
    probability of the paths that end in a blank (``pb``) and of those that end in its last character
    (``pnb``); a prefix's score is ``log(pb + pnb) + lm_weight * log P_lm(prefix) + length_bonus * |prefix|``,
    and at the end the language model's end-of-sentence term is added. Spaces separate words: a prefix never
    starts with a space or holds two in a row (those paths stay with the prefix), the form of a transcript.
    A frame reads the language model only for the beams it extended (a kept prefix keeps its row), and each
    beam keeps only its last character and its parent: the best prefix is read back once, after the last frame.

    Args:
        logits: float [batch, T, C].
        lengths: int [batch] valid frames.
        lm: the character model, over the same classes.
        beam_width: prefixes kept after each frame.
        lm_weight: the language model's weight (0: none).
        length_bonus: added per character, against the language model's pull toward short transcripts.
        space_id: the class of the word separator.

    Returns:
        ``(ids, scores)``: int32 ragged [batch, None] class ids of the best prefix, and its score [batch].
    """
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
    batch, frames, classes = tf.shape(log_probs)[0], tf.shape(log_probs)[1], tf.shape(log_probs)[2]
    lengths = tf.cast(lengths, tf.int32)
    width = beam_width
    chars = tf.range(1, classes)  # the candidates of an extension
    minus_inf = tf.constant(-np.inf, tf.float32)
    beams = tf.range(width)[None, :]
    only_first = tf.where(beams == 0, 0.0, minus_inf) + tf.zeros([batch, 1])
    state = {
        "last": tf.zeros([batch, width], tf.int32),  # the prefix's last character (0: none)
        "size": tf.zeros([batch, width], tf.int32),
        "blank": only_first,  # log pb
        "nonblank": tf.fill([batch, width], minus_inf),  # log pnb
        "lm": tf.zeros([batch, width]),  # the language model's and the bonus' share of the score
        "context": tf.zeros([batch, width], tf.int64),
        "hash": tf.zeros([batch, width, 2], tf.int64),  # of the prefix
        "parent": tf.fill([batch, width, 2], tf.constant(-1, tf.int64)),  # of the prefix less its last character
    }
    state["next"] = lm.next_log_probs(state["context"])  # [batch, width, C + 1]

    def step(t: tf.Tensor, state: dict[str, tf.Tensor], came_from: tf.TensorArray, emitted: tf.TensorArray
             ) -> tuple[tf.Tensor, dict[str, tf.Tensor], tf.TensorArray, tf.TensorArray]:
        frame = log_probs[:, t]  # [batch, C]
        size, last = state["size"], state["last"]
        total = _logaddexp(state["blank"], state["nonblank"])
        empty = size == 0
        after_space = empty | (last == space_id)  # a space here stays with the prefix
        last_prob = tf.where(empty, minus_inf, tf.gather(frame, last, batch_dims=1))
        stay_blank = total + frame[:, :1]
        stay_nonblank = tf.where(after_space, total + frame[:, space_id, None], state["nonblank"] + last_prob)
        # extensions [batch, width, C - 1]: a repeat of the last character needs a blank between
        repeat = chars[None, None, :] == last[..., None]
        extend = tf.where(repeat, state["blank"][..., None], total[..., None]) + frame[:, None, 1:]
        extend = tf.where((chars[None, None, :] == space_id) & after_space[..., None], minus_inf, extend)
        extend_lm = state["lm"][..., None] + lm_weight * state["next"][..., 1:classes] + length_bonus
        # an extension that is another beam's prefix adds to that beam (paths ending in its last character)
        parent = tf.reduce_all(tf.equal(state["hash"][:, :, None, :], state["parent"][:, None, :, :]), axis=-1)
        alive = tf.math.is_finite(total + state["lm"])
        same = (parent & (size[:, :, None] == size[:, None, :] - 1) & ~empty[:, None, :]
                & alive[:, None, :] & alive[:, :, None])  # [batch, from i, onto j]
        onto = tf.one_hot(last - 1, classes - 1, on_value=True, off_value=False)  # [batch, j, C - 1]
        moved = same[..., None] & onto[:, None, :, :]  # [batch, i, j, C - 1]
        gained = tf.reduce_logsumexp(tf.where(moved, extend[:, :, None, :], minus_inf), axis=[1, 3])
        stay_nonblank = _logaddexp(stay_nonblank, gained)
        extend = tf.where(tf.reduce_any(moved, axis=2), minus_inf, extend)
        stay_score = _logaddexp(stay_blank, stay_nonblank) + state["lm"]
        scores = tf.concat([stay_score, tf.reshape(extend + extend_lm, [batch, -1])], axis=1)
        _, chosen = tf.math.top_k(scores, k=width)  # [batch, width]
        from_beam = tf.where(chosen < width, chosen, (chosen - width) // (classes - 1))
        extended = chosen >= width
        symbol = tf.where(extended, (chosen - width) % (classes - 1) + 1, 0)

        def pick(values: tf.Tensor) -> tf.Tensor:  # each new beam's row of a per-beam tensor
            return tf.gather(values, from_beam, batch_dims=1)

        extend_flat = tf.reshape(extend, [batch, -1])
        extend_lm_flat = tf.reshape(extend_lm, [batch, -1])
        new = {
            "last": tf.where(extended, symbol, pick(last)),
            "size": pick(size) + tf.cast(extended, tf.int32),
            "blank": tf.where(extended, minus_inf, pick(stay_blank)),
            "nonblank": tf.where(extended, tf.gather(extend_flat, tf.maximum(chosen - width, 0), batch_dims=1),
                                 pick(stay_nonblank)),
            "lm": tf.where(extended, tf.gather(extend_lm_flat, tf.maximum(chosen - width, 0), batch_dims=1),
                           pick(state["lm"])),
            "context": tf.where(extended, lm.next_context(pick(state["context"]), symbol), pick(state["context"])),
            "hash": tf.where(extended[..., None], _extend_hash(pick(state["hash"]), symbol), pick(state["hash"])),
            "parent": tf.where(extended[..., None], pick(state["hash"]), pick(state["parent"])),
        }
        # a beam that kept its prefix keeps its row of the language model; only an extended one needs a new row
        grown = tf.where(extended)
        new["next"] = tf.tensor_scatter_nd_update(pick(state["next"]), grown,
                                                  lm.next_log_probs(tf.gather_nd(new["context"], grown)))
        running = t < lengths  # rows past their last frame keep their beams
        new = {key: tf.where(tf.reshape(running, [-1] + [1] * (len(value.shape) - 1)), value, state[key])
               for key, value in new.items()}
        # each beam's parent and the character it added: the prefixes are read back once, at the end
        came_from = came_from.write(t + 1, tf.where(running[:, None], from_beam, beams))
        emitted = emitted.write(t + 1, tf.where(running[:, None], symbol, 0))
        return t + 1, new, came_from, emitted

    # a graph may know the batch at the start (a batch of one) and not after a gather: every dimension may vary
    invariants = {key: tf.TensorShape([None] * len(value.shape)) for key, value in state.items()}
    # entry 0 is the start (every beam its own parent, nothing added), so that no history is empty
    history = [tf.TensorArray(tf.int32, size=frames + 1, element_shape=tf.TensorShape([None, None])).write(0, start)
               for start in (beams + tf.zeros([batch, 1], tf.int32), tf.zeros([batch, width], tf.int32))]
    _, state, came_from, emitted = tf.while_loop(
        lambda t, *_: t < frames, step, (tf.constant(0), state, *history),
        shape_invariants=(tf.TensorShape([]), invariants, tf.TensorShape(None), tf.TensorShape(None)))
    final = (_logaddexp(state["blank"], state["nonblank"]) + state["lm"]
             + lm_weight * state["next"][..., lm.end])
    best = tf.argmax(final, axis=1, output_type=tf.int32)
    ids = _read_back(came_from.stack(), emitted.stack(), best)
    return ids, tf.gather(final, best, batch_dims=1)


def _read_back(came_from: tf.Tensor, emitted: tf.Tensor, best: tf.Tensor) -> tf.RaggedTensor:
    """The characters of the prefix that beam ``best`` holds after the last frame.

    Args:
        came_from: int32 [frames + 1, batch, width]: each beam's beam at the frame before (entry 0: the start).
        emitted: int32 [frames + 1, batch, width]: the character each beam added at the frame (0: none).
        best: int32 [batch]: the beam to read.

    Returns:
        int32 ragged [batch, None], in the order the characters were added.
    """
    def back(carry: tuple[tf.Tensor, tf.Tensor], frame: tuple[tf.Tensor, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
        beam, _ = carry
        parents, characters = frame
        return tf.gather(parents, beam, batch_dims=1), tf.gather(characters, beam, batch_dims=1)

    start = (best, tf.zeros_like(best))
    _, added = tf.scan(back, (came_from[::-1], emitted[::-1]), initializer=start)  # [frames + 1, batch], last first
    added = tf.reverse(tf.transpose(added), axis=[1])
    return tf.ragged.boolean_mask(added, added > 0)


def ids_to_text(ids: tf.RaggedTensor, chars: tf.Tensor) -> tf.Tensor:
    """Joins class ids into transcripts in the form of the training transcripts: spaces collapsed, none at the ends.

    Args:
        ids: class ids [batch, (labels)] (a decoder's output).
        chars: the text of each class (``chars[0]`` the blank's, "").

    Returns:
        string [batch]. A model may emit a space before its first word (clips open with silence, which no
        transcript spells) or two in a row; neither is text, so neither counts as an error or reaches a user.
    """
    joined = tf.strings.reduce_join(tf.gather(chars, ids), axis=-1)
    return tf.strings.strip(tf.strings.regex_replace(joined, " +", " "))


def ctc_word_spans(logits: tf.Tensor, lengths: tf.Tensor, chars: tf.Tensor, space_id: int,
                   seconds_per_frame: float) -> dict[str, tf.Tensor]:
    """The words of the greedy transcript with their times, from the frame posteriors.

    The greedy path is cut into runs of one class. A word is the character runs
    between space runs (or the ends): it starts at its first run's first frame and
    ends after its last run's last frame. Its confidence is the mean, over its
    characters, of the character's mean posterior over its run's frames.

    Args:
        logits: float [batch, T, C].
        lengths: int [batch] valid frames.
        chars: string [C], the text of each class (``chars[0]`` = "").
        space_id: the class of the word separator.
        seconds_per_frame: the time between output frames.

    Returns:
        ``words`` (string [batch, W], "" past the end), ``start`` and ``end``
        (float32 seconds [batch, W]), ``confidence`` (float32 [batch, W]) and
        ``num_words`` (int32 [batch]).
    """
    probs = tf.nn.softmax(tf.cast(logits, tf.float32), axis=-1)
    best = tf.argmax(probs, axis=-1, output_type=tf.int32)
    batch, frames = tf.shape(best)[0], tf.shape(best)[1]
    lengths = tf.cast(lengths, tf.int32)
    valid = tf.sequence_mask(lengths, frames)
    previous = tf.pad(best[:, :-1], [[0, 0], [1, 0]], constant_values=-1)
    change = valid & (best != previous)
    times = tf.broadcast_to(tf.range(frames)[None], tf.shape(best))
    run_start = tf.ragged.boolean_mask(times, change)
    run_class = tf.ragged.boolean_mask(best, change)
    run_end = tf.concat([run_start[:, 1:], tf.RaggedTensor.from_tensor(lengths[:, None])], axis=1)
    # mean posterior of the best class over each run, from a cumulative sum over frames
    totals = tf.pad(tf.cumsum(tf.where(valid, tf.reduce_max(probs, axis=-1), 0.0), axis=1), [[0, 0], [1, 0]])
    flat_totals = tf.reshape(totals, [-1])
    rows = run_start.value_rowids()
    offsets = tf.cast(rows, tf.int32) * (frames + 1)
    starts, ends, classes = run_start.flat_values, run_end.flat_values, run_class.flat_values
    confidence = ((tf.gather(flat_totals, offsets + ends) - tf.gather(flat_totals, offsets + starts))
                  / tf.cast(tf.maximum(ends - starts, 1), tf.float32))
    is_char = classes != BLANK
    rows, starts, ends = rows[is_char], starts[is_char], ends[is_char]
    classes, confidence = classes[is_char], confidence[is_char]
    is_space = classes == space_id
    first_in_row = tf.concat([[True], rows[1:] != rows[:-1]], axis=0)
    after_space = tf.concat([[True], is_space[:-1]], axis=0)
    word_start = ~is_space & (first_in_row | after_space)
    word_ids = tf.cumsum(tf.cast(word_start, tf.int32)) - 1
    in_word = ~is_space
    word_ids, rows = word_ids[in_word], rows[in_word]
    num_words = tf.reduce_sum(tf.cast(word_start, tf.int32))
    text = tf.strings.unsorted_segment_join(tf.gather(chars, classes[in_word]), word_ids, num_words)
    word_rows = tf.math.segment_min(rows, word_ids)

    def per_row(values: tf.Tensor, default: Any) -> tf.Tensor:
        ragged = tf.RaggedTensor.from_value_rowids(values, word_rows, nrows=tf.cast(batch, tf.int64))
        return ragged.to_tensor(default_value=default)

    seconds = tf.constant(seconds_per_frame, tf.float32)
    return {
        "words": per_row(text, ""),
        "start": per_row(tf.cast(tf.math.segment_min(starts[in_word], word_ids), tf.float32) * seconds, 0.0),
        "end": per_row(tf.cast(tf.math.segment_max(ends[in_word], word_ids), tf.float32) * seconds, 0.0),
        "confidence": per_row(tf.math.segment_mean(confidence[in_word], word_ids), 0.0),
        "num_words": tf.math.bincount(tf.cast(word_rows, tf.int32), minlength=batch, maxlength=batch),
    }


@keras.saving.register_keras_serializable(package="seqapps")
class CTCSpeechModel(keras.Model):
    """Waveform to per-frame character logits, trained with CTC.

    Args:
        num_classes: characters plus one (class 0 is the blank).
        sample_rate: the waveform's rate (Hz).
        n_fft, hop_length, n_mels: the log-mel front end (window and hop in samples).
        stride: output frames per ``stride`` feature frames.
        conv_filters: filters of the strided Conv1D that subsamples time (kernel
            ``2 * stride + 1``, ReLU); 0 stacks ``stride`` frames instead (no weights).
            With an HRNN encoder the convolution trains through the gradient that the HRNN's lean
            path returns for its inputs; it sees ``stride`` frames ahead (30 ms by default).
        encoder: "birnn" (stacked bidirectional RNNs), "hrnn" (``DecoupledHRNN``,
            causal, trained with its memory-lean gradients) or "bihrnn" (``BidirectionalHRNN``:
            that layer and a copy reading backwards, each with its lean gradients).
        cell: "gru" or "lstm".
        units: units per direction of each bidirectional layer, or per HRNN level.
        dropout: dropout between layers (birnn only).
        hrnn_periods: lower-level frames per upper tick (hrnn, bihrnn).
        hrnn_mode: the ``DecoupledHRNN`` mode (hrnn, bihrnn).
        augment: augmentations of each training batch: ``WaveformAugment``'s (``train_step`` only) and
            ``FeatureAugment``'s (``vtlp``, ``specaugment``: on the normalised log-mel of a training call).
        augment_probability: the share of examples each augmentation but speed touches.
        vtlp_warp: the range of VTLP's warp factors (``FeatureAugment``'s ``warp``).
        seed: seed of the augmentations' draws.
        **kwargs: ``keras.Model`` arguments (``name``).

    Call arguments:
        inputs: ``{"waveform": float [batch, samples], "length": int [batch]}``,
            zero-padded waveforms and their valid samples.
        training: dropout and the HRNN's auxiliary losses.

    Returns:
        Logits [batch, frames, num_classes]; ``output_lengths(length)`` gives the valid frames.

    Example:
    ```python
    model = CTCSpeechModel(num_classes=28, units=[64])
    logits = model({"waveform": np.zeros((2, 16000), "float32"), "length": np.array([16000, 8000])})
    ```
    """

    def __init__(self, num_classes: int, sample_rate: int = 16000, n_fft: int = 400, hop_length: int = 160,
                 n_mels: int = 80, stride: int = 2, conv_filters: int = 0, encoder: str = "birnn",
                 cell: str = "gru", units: list[int] | None = None, dropout: float = 0.0, hrnn_periods: int = 4,
                 hrnn_mode: str = "decoupled", augment: list[str] | None = None, augment_probability: float = 0.5,
                 vtlp_warp: tuple[float, float] = VTLP_WARP, seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {ENCODERS}, got encoder={encoder!r}")
        if cell not in CELLS:
            raise ValueError(f"cell must be one of {tuple(CELLS)}, got cell={cell!r}")
        units = list(units or [128, 128])
        if encoder in HRNN_ENCODERS and len(units) < 2:
            raise ValueError(f"the hrnn encoder needs units for at least two levels, got units={units}")
        self.num_classes, self.sample_rate, self.n_fft, self.hop_length = num_classes, sample_rate, n_fft, hop_length
        self.n_mels, self.stride, self.conv_filters, self.encoder = n_mels, stride, conv_filters, encoder
        self.cell, self.units, self.dropout = cell, units, dropout
        self.hrnn_periods, self.hrnn_mode = hrnn_periods, hrnn_mode
        self.augment, self.augment_probability, self.seed = list(augment or []), augment_probability, seed
        self.vtlp_warp = tuple(vtlp_warp)
        unknown = sorted(set(self.augment) - set(ALL_AUGMENTATIONS))
        if unknown:
            raise ValueError(f"augment: unknown augmentations {unknown}, expected some of {ALL_AUGMENTATIONS}")
        on_waveform = [name for name in self.augment if name in AUGMENTATIONS]
        on_features = [name for name in self.augment if name in FEATURE_AUGMENTATIONS]
        self.augmenter = (WaveformAugment(on_waveform, sample_rate, augment_probability, seed=seed, name="augment")
                          if on_waveform else None)
        self.frontend = LogMelSpectrogram(sample_rate=sample_rate, n_fft=n_fft, hop_length=hop_length, n_mels=n_mels,
                                          name="log_mel")
        # its own seed: the same draws as WaveformAugment's would tie a clip's masks to its noise
        self.feature_augmenter = (FeatureAugment(on_features, fmax=sample_rate / 2, warp=self.vtlp_warp,
                                                 seed=None if seed is None else seed + 1, name="augment_features")
                                  if on_features else None)
        self.conv = (keras.layers.Conv1D(conv_filters, 2 * stride + 1, strides=stride, padding="same",
                                         activation="relu", name="subsample")
                     if conv_filters else None)
        if encoder == "birnn":
            self.rnns = [keras.layers.Bidirectional(CELLS[cell](n, return_sequences=True), name=f"birnn_{i}")
                         for i, n in enumerate(units)]
            self.drops = [keras.layers.Dropout(dropout) for _ in units]
            self.head = keras.layers.Dense(num_classes, name="logits")
        else:
            forward = DecoupledHRNN([CELL_TYPES[cell](n) for n in units], periods=hrnn_periods, mode=hrnn_mode,
                                    aux_hidden_units=64, aux_loss="mse", output_units=num_classes, name="hrnn")
            self.hrnn = forward if encoder == "hrnn" else BidirectionalHRNN(forward, name="bihrnn")
        self.loss_tracker = keras.metrics.Mean(name="loss")

    @property
    def seconds_per_frame(self) -> float:
        """The time between output frames."""
        return self.stride * self.hop_length / self.sample_rate

    @property
    def logits_layers(self) -> list[keras.layers.Dense]:
        """The Dense layers with one unit per class (the blank, then the characters): what fine-tuning grows.
        One, but two with ``bihrnn``, whose directions' heads are summed."""
        if self.encoder == "hrnn":
            return [self.hrnn.head]
        if self.encoder == "bihrnn":
            return [self.hrnn.forward.head, self.hrnn.backward.head]
        return [self.head]

    def output_lengths(self, length: tf.Tensor) -> tf.Tensor:
        """Valid output frames of waveforms with ``length`` valid samples."""
        frames = self.frontend.frame_lengths(length)
        return (frames + self.stride - 1) // self.stride

    def features(self, inputs: dict[str, tf.Tensor], training: bool | None = None) -> tuple[tf.Tensor, tf.Tensor]:
        """Normalised, subsampled features [batch, T, F] and their mask [batch, T] (no weights but the conv).

        In training, ``feature_augmenter`` (VTLP, SpecAugment) changes the normalised log-mel first."""
        waveform = tf.cast(inputs["waveform"], tf.float32)
        length = tf.minimum(tf.cast(tf.reshape(inputs["length"], [-1]), tf.int32), tf.shape(waveform)[1])
        mel = tf.cast(self.frontend(waveform, lengths=length), tf.float32)  # statistics in float32 under any policy
        frames = self.frontend.frame_lengths(length)
        mask = tf.sequence_mask(frames, tf.shape(mel)[1], dtype=tf.float32)[..., None]
        count = tf.maximum(tf.reduce_sum(mask, axis=1, keepdims=True), 1.0)
        mean = tf.reduce_sum(mel * mask, axis=1, keepdims=True) / count
        variance = tf.reduce_sum(tf.square(mel - mean) * mask, axis=1, keepdims=True) / count
        x = (mel - mean) * tf.math.rsqrt(variance + 1e-5) * mask
        if training and self.feature_augmenter is not None:
            x = self.feature_augmenter(x, frames, training=True)
        x = tf.cast(x, self.compute_dtype)
        if self.conv is None:
            pad = (-tf.shape(x)[1]) % self.stride
            x = tf.pad(x, [[0, 0], [0, pad], [0, 0]])
            x = tf.reshape(x, [tf.shape(x)[0], tf.shape(x)[1] // self.stride, self.stride * self.n_mels])
        else:
            x = self.conv(x)
        out = self.output_lengths(length)
        return x, tf.sequence_mask(out, tf.shape(x)[1])

    def build(self, input_shape: Any = None) -> None:
        self.frontend.build((None, None))
        width = self.stride * self.n_mels
        if self.conv is not None:
            self.conv.build((None, None, self.n_mels))
            width = self.conv_filters
        if self.encoder in HRNN_ENCODERS:
            self.hrnn.build((None, None, width))
        else:
            for rnn, units in zip(self.rnns, self.units):
                rnn.build((None, None, width))
                width = 2 * units
            self.head.build((None, None, width))
        self.built = True

    def call(self, inputs: dict[str, tf.Tensor], training: bool | None = None) -> tf.Tensor:
        x, mask = self.features(inputs, training=training)
        if self.encoder in HRNN_ENCODERS:
            return self.hrnn(x, mask=mask, training=training)
        for rnn, drop in zip(self.rnns, self.drops):
            x = drop(rnn(x, mask=mask, training=training), training=training)
        return self.head(x)

    @property
    def metrics(self) -> list[keras.metrics.Metric]:
        return [self.loss_tracker]

    def augmented(self, inputs: dict[str, tf.Tensor], labels: tf.Tensor) -> dict[str, tf.Tensor]:
        """The batch through ``augmenter`` (the inputs when there is none); speed never leaves an example
        fewer frames than its labels need."""
        if self.augmenter is None:
            return inputs
        labels = tf.cast(labels, tf.int32)
        repeats = tf.cast((labels[:, 1:] == labels[:, :-1]) & (labels[:, 1:] > 0), tf.int32)
        needed = tf.reduce_sum(tf.cast(labels > 0, tf.int32), axis=1) + tf.reduce_sum(repeats, axis=1)
        return self.augmenter(inputs, min_length=(needed * self.stride + 1) * self.hop_length, training=True)

    def train_step(self, data: tuple) -> dict[str, tf.Tensor]:
        inputs, labels = self.augmented(data[0], data[1]), data[1]
        if self.encoder in HRNN_ENCODERS:
            loss, grads = self._lean_hrnn_gradients(inputs, labels)
        else:
            with tf.GradientTape() as tape:
                logits = self(inputs, training=True)
                loss = tf.reduce_mean(ctc_loss(labels, logits, self.output_lengths(inputs["length"])))
                total = loss + tf.add_n(self.losses) if self.losses else loss
            grads = tape.gradient(total, self.trainable_variables)
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if replicas > 1:  # the optimizer sums replicas' gradients of their local mean losses
            grads = [grad / replicas for grad in grads]
        self.optimizer.apply(grads, self.trainable_variables)
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

    def _lean_hrnn_gradients(self, inputs: dict[str, tf.Tensor], labels: tf.Tensor) -> tuple[tf.Tensor, list]:
        """CTC gradients through ``DecoupledHRNN.loss_and_gradients``.

        CTC is not a sum of per-frame losses, so the lean path gets a per-frame linear
        surrogate ``<g_t, logits_t>`` with ``g = dCTC/dlogits`` from a forward pass: its
        gradient is the CTC gradient, computed with the layer's segment recomputation. The
        convolution before the HRNN, if any, gets the gradient the lean path returns for its inputs.

        Returns:
            ``(loss, gradients)``, the gradients aligned with ``self.trainable_variables``.
        """
        with tf.GradientTape() as front_end:  # the convolution, if any: trained through the HRNN's input gradient
            x, mask = self.features(inputs, training=True)  # augmented once: both passes below read this x
        logits = self.hrnn(x, mask=mask, training=False)
        with tf.GradientTape() as tape:
            tape.watch(logits)
            loss = tf.reduce_mean(ctc_loss(labels, logits, self.output_lengths(inputs["length"])))
        steps = tf.maximum(tf.reduce_sum(tf.cast(mask, tf.float32)), 1.0)  # the lean path divides by them
        targets = tf.stop_gradient(tape.gradient(loss, logits)) * steps
        if self.encoder == "bihrnn":
            _, grads, d_x = self.hrnn.linear_gradients(x, targets, mask=mask, return_input_gradients=True)
        else:
            _, grads, d_x = self.hrnn.loss_and_gradients(x, targets, lambda g, y: tf.reduce_sum(g * y, axis=-1),
                                                         mask=mask, return_input_gradients=True)
        by_variable = {id(v): g for v, g in zip(self.hrnn.trainable_variables, grads)}
        if self.conv is not None:
            conv_variables = self.conv.trainable_variables
            by_variable.update(zip(map(id, conv_variables), front_end.gradient(x, conv_variables, output_gradients=d_x)))
        return loss, [by_variable[id(v)] for v in self.trainable_variables]

    def test_step(self, data: tuple) -> dict[str, tf.Tensor]:
        inputs, labels = data[0], data[1]
        logits = self(inputs, training=False)
        self.loss_tracker.update_state(tf.reduce_mean(ctc_loss(labels, logits, self.output_lengths(inputs["length"]))))
        return {"loss": self.loss_tracker.result()}

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name, "num_classes": self.num_classes, "sample_rate": self.sample_rate,
                "n_fft": self.n_fft, "hop_length": self.hop_length, "n_mels": self.n_mels, "stride": self.stride,
                "conv_filters": self.conv_filters, "encoder": self.encoder, "cell": self.cell, "units": self.units,
                "dropout": self.dropout, "hrnn_periods": self.hrnn_periods, "hrnn_mode": self.hrnn_mode,
                "augment": self.augment, "augment_probability": self.augment_probability,
                "vtlp_warp": list(self.vtlp_warp), "seed": self.seed}

