"""Batch Noise Contrastive Estimation (B-NCE) output layer.

Oualil & Klakow (2017), "A Batch Noise Contrastive Estimation Approach for
Training Large Vocabulary Language Models". The output layer is restricted to
the batch's target words: each row's positive is its own target, and its noise
samples are the other targets of the batch (plus, optionally, ``K`` extra words
drawn from the unigram and shared across the batch). The training cost is one
dense ``B x (B + K)`` score matrix; there is no per-row sampling step. As in the
paper, a row's own word among the others' targets stays a noise sample, so every
word is noise ``(B - 1) x count(w)`` times (unigram noise), and the updates of
duplicated words are summed. For sequences ``[B, T, H]`` the paper's batch is the
``B`` sequences at one time step (``noise_scope="time_step"``). Padded tokens
(``target_mask``) are in no batch: never noise, and ``K`` counts the real targets.
With ``compact_batch`` the padded rows never reach the output layer, and a flat
batch's B-NCE is computed on its distinct words, each noise term weighted by its
count (``distinct_batch_nce_loss``): the same loss, on an ``R x U`` matrix of
real rows by distinct words instead of ``N x N``.

The functional cores (``batch_nce_loss``, ``sampled_nce_loss``,
``softmax_loss``) take the output embedding as a ``V x H`` matrix and gather its
rows, so that autodiff yields ``tf.IndexedSlices`` gradients for the kernel and
the bias (an ``H x V`` layout would make them dense). They run inside
``tf.function`` and under ``jit_compile=True``. Under XLA the target range
checks are compiled out and ``tf.gather`` clamps out-of-range ids instead of
failing, so check ids eagerly or in a non-XLA graph first.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

from seqapps.layers.bnce_options import LOSSES, NOISE_SCOPES
from seqapps.layers.lexicon import lexical_log_bias, lexical_log_bias_at_columns, lexical_log_noise_mass

NOISE_SUM_TOLERANCE = 1e-3


def unigram_distribution(counts: Sequence[float] | np.ndarray, smoothing: float = 1.0) -> np.ndarray:
    """Unigram noise distribution from token counts, with add-``smoothing``.

    Args:
        counts: ``[V]`` non-negative token counts from the training data.
        smoothing: added to every count so that no word has probability 0.

    Returns:
        ``[V]`` float64 probabilities that sum to 1.
    """
    counts = np.asarray(counts, dtype="float64")
    if counts.ndim != 1 or counts.size == 0 or not np.all(np.isfinite(counts)) or np.any(counts < 0):
        raise ValueError(f"`counts` must be a non-empty 1-D array of finite non-negative numbers; got {counts!r}")
    smoothed = counts + smoothing
    if np.any(smoothed <= 0):
        raise ValueError(f"`counts` has zero counts and `smoothing`={smoothing}; use smoothing > 0")
    return smoothed / smoothed.sum()


def validate_noise_probs(noise_probs: Any, vocab_size: int | None = None) -> np.ndarray:
    """Checks that ``noise_probs`` is a strictly positive distribution.

    Args:
        noise_probs: ``[V]`` noise probabilities.
        vocab_size: if given, the required length ``V``.

    Returns:
        The probabilities as a float64 NumPy array.
    """
    probs = np.asarray(keras.ops.convert_to_numpy(noise_probs), dtype="float64")
    if probs.ndim != 1 or (vocab_size is not None and probs.shape[0] != vocab_size):
        raise ValueError(f"`noise_probs` must have shape ({vocab_size or 'V'},); got shape {probs.shape}")
    if not np.all(np.isfinite(probs)) or np.any(probs <= 0):
        bad = np.flatnonzero(~(probs > 0))[:5].tolist()
        raise ValueError(
            f"`noise_probs` must be finite and > 0 for every word (log p_n is used); got {probs[bad].tolist()} "
            f"at ids {bad}. Smooth the counts, e.g. with `unigram_distribution(counts, smoothing=1.0)`."
        )
    total = probs.sum()
    if abs(total - 1.0) > NOISE_SUM_TOLERANCE:
        raise ValueError(f"`noise_probs` must sum to 1 (tolerance {NOISE_SUM_TOLERANCE}); got sum={total:.6g}")
    return probs


def _maybe_validate_noise_probs(noise_probs: Any) -> None:
    """Validates concrete (eager or NumPy) noise probabilities; variables are checked when set."""
    if isinstance(noise_probs, (tf.Variable, keras.Variable)) or not tf.executing_eagerly():
        return
    validate_noise_probs(noise_probs)


def _check_targets(targets: tf.Tensor, vocab_size: tf.Tensor) -> list[tf.Operation]:
    """Assertions that every target id lies in ``[0, vocab_size)`` (compiled out by XLA)."""
    return [
        tf.debugging.assert_non_negative(targets, message="`targets` must be >= 0"),
        tf.debugging.assert_less(
            targets, tf.cast(vocab_size, targets.dtype), message="`targets` must be < vocab_size (the kernel's rows)"
        ),
    ]


def batch_nce_loss_from_scores(
    scores: tf.Tensor, column_noise_probs: tf.Tensor, ignore_mask: tf.Tensor | None = None,
    column_mask: tf.Tensor | None = None,
) -> tf.Tensor:
    """B-NCE loss per row from the score matrix ``S``; its gradient w.r.t. ``S`` is the paper's ``G``.

    Row ``i``'s positive is column ``i``; every other column is a noise sample,
    so ``K = M - 1`` noise samples per row. With ``O = exp(S)`` and
    ``Y_ij = O_ij + K N_j`` the gradient is ``G_ij = O_ij / Y_ij`` off the
    diagonal and ``G_ii = -K N_i / Y_ii`` on it (0 where ``ignore_mask``).
    With ``column_mask``, the masked columns (padding) are in no row's noise
    and their rows' losses are 0, so that ``K`` is the number of unmasked
    columns minus 1: the loss of the batch with its padding removed.

    Args:
        scores: ``[..., B, M]`` float scores ``S = L W_t^T + C_t - log Z``, ``M >= B``
            (leading axes: independent batches).
        column_noise_probs: ``[..., M]`` noise probabilities ``N_j = p_n(w_j)``.
        ignore_mask: optional ``[..., B, M]`` bool, True for noise entries to drop
            (accidental hits). Diagonal entries are never dropped.
        column_mask: optional ``[..., M]`` bool, False for columns that are not
            samples (padding). A row whose batch has no other column has loss 0.

    Returns:
        ``[..., B]`` loss ``-log P(D=1|w_i) - sum_{j != i} log(1 - P(D=1|w_j))``.
    """
    scores = tf.convert_to_tensor(scores)
    shape = tf.shape(scores)
    labels = tf.eye(shape[-2], shape[-1], dtype=scores.dtype)
    if column_mask is None:
        num_noise = tf.cast(shape[-1] - 1, scores.dtype)
    else:
        column_mask = tf.cast(column_mask, tf.bool)
        num_noise = tf.reduce_sum(tf.cast(column_mask, scores.dtype), axis=-1, keepdims=True) - 1.0  # [..., 1]
    # with no other column (K = 0) the row has no noise and its loss is 0; log(0) must not reach the sum
    log_noise = tf.math.log(tf.maximum(num_noise, 1.0) * tf.cast(column_noise_probs, scores.dtype))
    logits = scores - log_noise[..., tf.newaxis, :]
    losses = tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.broadcast_to(labels, tf.shape(logits)), logits=logits)
    if ignore_mask is not None:
        losses = tf.where(ignore_mask, tf.zeros_like(losses), losses)
    if column_mask is None:
        return tf.reduce_sum(losses, axis=-1)
    losses = tf.where(column_mask[..., tf.newaxis, :], losses, tf.zeros_like(losses))
    row_mask = tf.logical_and(column_mask[..., : shape[-2]], num_noise > 0)
    return tf.where(row_mask, tf.reduce_sum(losses, axis=-1), tf.zeros_like(losses[..., 0]))


def batch_nce_loss(
    hidden: tf.Tensor,
    kernel: tf.Tensor,
    bias: tf.Tensor,
    targets: tf.Tensor,
    noise_probs: tf.Tensor,
    *,
    log_z: float = 9.0,
    extra_noise_ids: tf.Tensor | None = None,
    remove_accidental_hits: bool = False,
    column_bias: Callable[[tf.Tensor], tf.Tensor] | None = None,
    target_mask: tf.Tensor | None = None,
) -> tf.Tensor:
    """Per-row B-NCE loss (Oualil & Klakow, 2017), with the optional adaptive extra noise.

    The output layer is restricted to the columns ``c = [targets, extra_noise_ids]``
    (``M = B + K_extra``): ``S = L W_c^T + C_c - log Z``. Row ``i``'s positive is
    column ``i`` and its noise samples are the other ``M - 1`` columns, so the
    posterior uses ``K = B - 1 + K_extra``. By default (the paper's) a column
    holding row ``i``'s own word (a duplicate target, or an extra noise word
    equal to it) is one of its noise samples. With ``remove_accidental_hits``
    such columns are not counted as its noise (the noise is then no longer the
    unigram); ``K`` stays ``M - 1``. Gradients for duplicated words add up in the
    ``IndexedSlices`` of the kernel. Leading axes of ``hidden`` and ``targets``
    are independent batches (for example the time steps of ``[T, B, H]``).

    Args:
        hidden: ``[..., B, H]`` hidden states ``L``.
        kernel: ``[V, H]`` output embedding.
        bias: ``[V]`` output bias.
        targets: ``[..., B]`` int target ids.
        noise_probs: ``[V]`` unigram noise distribution ``p_n`` (> 0, sums to 1).
        log_z: the fixed log normaliser ``log Z``.
        extra_noise_ids: optional ``[K_extra]`` (shared by every batch) or
            ``[..., K_extra]`` (one set per batch) int ids drawn from ``p_n`` and
            shared by the batch's rows (adaptive B-NCE; use it when ``B`` is small).
        remove_accidental_hits: mask noise columns equal to the row's target.
        column_bias: optional function of the columns ``c`` (int ``[..., M]``) that returns each row's
            scores to add to theirs, ``[..., B, M]`` (for example ``dense_column_bias`` of a per-row bias).
        target_mask: optional ``[..., B]`` bool, False for padding: a padded target is in no row's
            noise and its own loss is 0, so ``K`` counts the real targets (and the extra noise) only.

    Returns:
        ``[..., B]`` float loss per row; its gradient w.r.t. ``S`` is the paper's ``G``.
    """
    hidden = tf.convert_to_tensor(hidden)
    targets = tf.convert_to_tensor(targets)
    if extra_noise_ids is None:
        static_batch = targets.shape[-1] if targets.shape.rank else None
        if static_batch == 1:
            raise ValueError(
                "batch_nce_loss with a batch of 1 target (`targets` shape (1,)) has no noise samples; "
                "pass `extra_noise_ids` (layer argument `extra_noise`) or use a larger batch"
            )
        checks = _check_targets(targets, tf.shape(kernel)[0])
        if static_batch is None:
            checks.append(
                tf.debugging.assert_greater(
                    tf.shape(targets)[-1], 1, message="B-NCE needs a batch of >= 2 targets or `extra_noise`"
                )
            )
        columns = targets
    else:
        extra_noise_ids = tf.cast(extra_noise_ids, targets.dtype)
        if extra_noise_ids.shape.rank == 1:
            extra_noise_ids = tf.broadcast_to(
                extra_noise_ids, tf.concat([tf.shape(targets)[:-1], tf.shape(extra_noise_ids)], 0)
            )
        checks = _check_targets(targets, tf.shape(kernel)[0])
        columns = tf.concat([targets, extra_noise_ids], axis=-1)
    _maybe_validate_noise_probs(noise_probs)
    with tf.control_dependencies(checks):
        columns = tf.identity(columns)
    weights = tf.gather(kernel, columns)
    scores = tf.matmul(hidden, weights, transpose_b=True) + tf.gather(bias, columns)[..., tf.newaxis, :] - log_z
    if column_bias is not None:
        scores += column_bias(columns)
    ignore_mask = None
    if remove_accidental_hits:
        hits = tf.equal(targets[..., :, tf.newaxis], columns[..., tf.newaxis, :])
        shape = tf.shape(hits)
        ignore_mask = tf.logical_and(hits, tf.logical_not(tf.eye(shape[-2], shape[-1], dtype=tf.bool)))
    column_mask = None
    if target_mask is not None:
        column_mask = tf.cast(target_mask, tf.bool)
        if extra_noise_ids is not None:  # the extra noise is always a sample
            column_mask = tf.concat([column_mask, tf.ones_like(extra_noise_ids, tf.bool)], axis=-1)
    return batch_nce_loss_from_scores(scores, tf.gather(noise_probs, columns), ignore_mask, column_mask)


def distinct_batch_nce_loss(
    hidden: tf.Tensor,
    kernel: tf.Tensor,
    bias: tf.Tensor,
    targets: tf.Tensor,
    noise_probs: tf.Tensor,
    *,
    log_z: float = 9.0,
    extra_noise_ids: tf.Tensor | None = None,
    remove_accidental_hits: bool = False,
    column_bias: Callable[[tf.Tensor], tf.Tensor] | None = None,
    target_mask: tf.Tensor | None = None,
) -> tf.Tensor:
    """``batch_nce_loss`` of one flat batch, computed on its distinct real words: the same loss, less work.

    A row's noise term of a word is the same for every column that holds the word, so the ``N x M`` score
    matrix of ``batch_nce_loss`` is rewritten exactly as ``R x U``: the ``R`` real (unmasked) rows against
    the ``U`` distinct words of the real targets and the extra noise, each noise term weighted by how many
    columns hold its word (minus the row's own column). Padded rows are never computed. The loss, ``K``
    and the gradients are ``batch_nce_loss``'s; the shapes are dynamic, so it does not run under XLA.

    Args:
        hidden: ``[N, H]`` hidden states ``L``.
        kernel, bias, noise_probs, log_z, remove_accidental_hits: as ``batch_nce_loss``.
        targets: ``[N]`` int target ids.
        extra_noise_ids: optional ``[K_extra]`` int ids drawn from ``p_n``, noise of every row.
        column_bias: optional function of distinct word ids (int ``[U]``) that returns every row's scores
            to add to theirs, ``[N, U]``.
        target_mask: optional ``[N]`` bool, False for padding (in no row's noise, loss 0).

    Returns:
        ``[N]`` float loss per row, 0 for padding.
    """
    hidden = tf.convert_to_tensor(hidden)
    targets = tf.cast(targets, tf.int32)
    if targets.shape.rank != 1:
        raise ValueError(f"distinct_batch_nce_loss takes one flat batch of targets, [N]; got {targets.shape}")
    checks = _check_targets(targets, tf.shape(kernel)[0])
    _maybe_validate_noise_probs(noise_probs)
    with tf.control_dependencies(checks):
        targets = tf.identity(targets)
    if target_mask is None:
        rows = tf.range(tf.shape(targets)[0])

        def real_rows(rows_of_all: tf.Tensor) -> tf.Tensor:
            return rows_of_all
    else:
        real = tf.cast(tf.cast(target_mask, tf.bool), tf.int32)
        rows = tf.cast(tf.where(real > 0)[:, 0], tf.int32)

        def real_rows(rows_of_all: tf.Tensor) -> tf.Tensor:  # in order, and with a dense gradient (not gather's)
            return tf.dynamic_partition(rows_of_all, real, 2)[1]
    real_hidden, real_targets = real_rows(hidden), real_rows(targets)
    samples = real_targets if extra_noise_ids is None else tf.concat(
        [real_targets, tf.cast(extra_noise_ids, tf.int32)], axis=0)
    words, word_slots = tf.unique(samples)  # [U]; each sample's slot among them
    num_words = tf.shape(words)[0]
    counts = tf.math.unsorted_segment_sum(tf.ones_like(word_slots, hidden.dtype), word_slots, num_words)
    num_noise = tf.cast(tf.shape(samples)[0] - 1, hidden.dtype)  # K: every other column
    own = tf.one_hot(word_slots[: tf.shape(rows)[0]], num_words, dtype=hidden.dtype)  # [R, U]
    noise_counts = counts[tf.newaxis, :] * (1.0 - own) if remove_accidental_hits else counts[tf.newaxis, :] - own
    scores = (tf.matmul(real_hidden, tf.gather(kernel, words), transpose_b=True)
              + tf.gather(bias, words)[tf.newaxis, :] - log_z)
    if column_bias is not None:
        scores += real_rows(column_bias(words))
    log_noise = tf.math.log(tf.maximum(num_noise, 1.0) * tf.cast(tf.gather(noise_probs, words), hidden.dtype))
    logits = scores - log_noise[tf.newaxis, :]
    positive = tf.reduce_sum(logits * own, axis=1)
    losses = tf.math.softplus(-positive) + tf.reduce_sum(noise_counts * tf.math.softplus(logits), axis=1)
    losses = tf.where(num_noise > 0, losses, tf.zeros_like(losses))  # a lone target has no noise
    return tf.scatter_nd(rows[:, tf.newaxis], losses, tf.shape(targets))


def sampled_nce_loss(
    hidden: tf.Tensor,
    kernel: tf.Tensor,
    bias: tf.Tensor,
    targets: tf.Tensor,
    noise_probs: tf.Tensor,
    noise_ids: tf.Tensor,
    *,
    log_z: float = 9.0,
    remove_accidental_hits: bool = False,
) -> tf.Tensor:
    """Per-row S-NCE loss with ``K`` noise samples shared across the batch.

    Dense ``B x (K + 1)`` formulation: the same posterior as B-NCE,
    ``sigmoid(s - log(K p_n(w)))`` with ``s = l.w + c - log Z``, but the noise
    columns are ``K`` words drawn from ``p_n`` instead of the batch's targets.

    Args:
        hidden: ``[B, H]`` hidden states.
        kernel: ``[V, H]`` output embedding.
        bias: ``[V]`` output bias.
        targets: ``[B]`` int target ids.
        noise_probs: ``[V]`` unigram noise distribution.
        noise_ids: ``[K]`` int noise ids drawn from ``noise_probs``.
        log_z: the fixed log normaliser.
        remove_accidental_hits: drop noise samples equal to the row's target.

    Returns:
        ``[B]`` float loss per row.
    """
    hidden = tf.convert_to_tensor(hidden)
    targets = tf.convert_to_tensor(targets)
    noise_ids = tf.cast(noise_ids, targets.dtype)
    _maybe_validate_noise_probs(noise_probs)
    with tf.control_dependencies(_check_targets(targets, tf.shape(kernel)[0])):
        targets = tf.identity(targets)
    num_noise = tf.cast(tf.size(noise_ids), hidden.dtype)
    positive = (
        tf.reduce_sum(hidden * tf.gather(kernel, targets), axis=1)
        + tf.gather(bias, targets)
        - log_z
        - tf.math.log(num_noise * tf.cast(tf.gather(noise_probs, targets), hidden.dtype))
    )
    negative = (
        tf.matmul(hidden, tf.gather(kernel, noise_ids), transpose_b=True)
        + tf.gather(bias, noise_ids)[tf.newaxis, :]
        - log_z
        - tf.math.log(num_noise * tf.cast(tf.gather(noise_probs, noise_ids), hidden.dtype))[tf.newaxis, :]
    )
    negative_losses = tf.math.softplus(negative)
    if remove_accidental_hits:
        hits = tf.equal(targets[:, tf.newaxis], noise_ids[tf.newaxis, :])
        negative_losses = tf.where(hits, tf.zeros_like(negative_losses), negative_losses)
    return tf.math.softplus(-positive) + tf.reduce_sum(negative_losses, axis=1)


def noise_centred_bias(logit_bias: tf.Tensor, noise_probs: tf.Tensor) -> tf.Tensor:
    """A per-row logit bias shifted so that it leaves the noise distribution's normaliser at 1.

    A bias such as the lexicon's ``log(p_lex + eps)`` moves every word's score of a row by about the
    same few nats. The softmax does not see a shift that is common to a row; the self-normalised
    losses (B-NCE, with its fixed ``log Z``) do, and would have to learn it back word by word. With
    ``b' = b - log sum_v p_n(v) exp(b_v)`` a model that scores the noise distribution (``s = log p_n
    + log Z``, where the output layer starts) stays normalised in every row, whatever the bias.

    Args:
        logit_bias: ``[..., V]`` scores added per row.
        noise_probs: ``[V]`` noise distribution ``p_n`` (> 0, sums to 1).

    Returns:
        The shifted bias, the shape of ``logit_bias``; its log-softmax is the original's.
    """
    log_noise = tf.math.log(tf.cast(noise_probs, logit_bias.dtype))
    return logit_bias - tf.reduce_logsumexp(logit_bias + log_noise, axis=-1, keepdims=True)


def dense_column_bias(logit_bias: tf.Tensor) -> Callable[[tf.Tensor], tf.Tensor]:
    """``batch_nce_loss``'s ``column_bias`` of a dense per-row bias: each row's entries of the columns.

    Args:
        logit_bias: ``[..., B, V]`` scores added per row to every word's.

    Returns:
        A function of the columns (int ``[..., M]``) that returns ``[..., B, M]``.
    """
    def at_columns(columns: tf.Tensor) -> tf.Tensor:
        shape = tf.concat([tf.shape(logit_bias)[:-1], tf.shape(columns)[-1:]], axis=0)
        row_columns = tf.broadcast_to(columns[..., tf.newaxis, :], shape)
        return tf.gather(logit_bias, row_columns, batch_dims=row_columns.shape.rank - 1)

    return at_columns


def full_logits(hidden: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor, logit_bias: tf.Tensor | None = None
                ) -> tf.Tensor:
    """Unnormalised scores ``l.w + c`` (plus a per-row ``logit_bias``) over the whole vocabulary.

    Args:
        hidden: ``[B, H]`` hidden states.
        kernel: ``[V, H]`` output embedding.
        bias: ``[V]`` output bias.
        logit_bias: optional ``[B, V]`` scores added per row.

    Returns:
        ``[B, V]`` logits.
    """
    logits = tf.matmul(hidden, kernel, transpose_b=True) + bias
    return logits if logit_bias is None else logits + logit_bias


def softmax_loss(hidden: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor, targets: tf.Tensor,
                 logit_bias: tf.Tensor | None = None) -> tf.Tensor:
    """Per-row full-softmax cross-entropy (dense kernel gradient).

    Args:
        hidden: ``[B, H]`` hidden states.
        kernel: ``[V, H]`` output embedding.
        bias: ``[V]`` output bias.
        targets: ``[B]`` int target ids.
        logit_bias: optional ``[B, V]`` scores added per row.

    Returns:
        ``[B]`` float ``-log softmax(l W^T + c)[target]``.
    """
    targets = tf.convert_to_tensor(targets)
    with tf.control_dependencies(_check_targets(targets, tf.shape(kernel)[0])):
        targets = tf.identity(targets)
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets,
                                                          logits=full_logits(hidden, kernel, bias, logit_bias))


def noise_ids_from_uniform(noise_cdf: tf.Tensor, uniform: tf.Tensor) -> tf.Tensor:
    """Draws ids from the noise distribution by inverse-CDF binary search (``O(K log V)``).

    An unrolled binary search of ``ceil(log2 V)`` gathers rather than
    ``tf.searchsorted``, which XLA lowers to ``K x V`` comparisons (24 ms for
    ``K=100, V=800k`` on a 2-core CPU, against 0.4 ms for this search).

    Args:
        noise_cdf: ``[V]`` cumulative sum of the noise probabilities (``V`` static).
        uniform: float samples in ``[0, 1)``, any shape.

    Returns:
        int32 ids ``i`` with ``cdf[i-1] <= u * cdf[-1] < cdf[i]``, the shape of ``uniform``.
    """
    noise_cdf = tf.convert_to_tensor(noise_cdf)
    size = int(noise_cdf.shape[0])
    values = tf.cast(uniform, noise_cdf.dtype) * noise_cdf[-1]
    low = tf.zeros_like(values, dtype=tf.int32)
    high = tf.fill(tf.shape(values), size - 1)
    for _ in range(max(1, math.ceil(math.log2(size)))):
        middle = (low + high) // 2
        right = tf.gather(noise_cdf, middle) <= values
        low = tf.where(right, middle + 1, low)
        high = tf.where(right, high, middle)
    return low


@keras.saving.register_keras_serializable(package="seqapps")
class BatchNCE(keras.layers.Layer):
    """Large-vocabulary output layer trained with B-NCE, S-NCE or a full softmax.

    The layer owns the output embedding (``vocab_size x H``, gathered by rows so
    that its gradient is ``tf.IndexedSlices`` for the sampled losses) and the
    bias, plus the unigram noise distribution as a non-trainable weight (saved
    with the model). ``loss`` selects the training criterion so the three train
    through the same layer:

    - ``"bnce"``: batch NCE; each row's noise samples are the other targets of
      the batch (``K = B - 1``; for sequences, of the same time step), plus ``extra_noise`` words drawn from the
      unigram and shared by the batch (adaptive B-NCE, ``K = B - 1 + extra``).
    - ``"snce"``: NCE with ``num_noise`` unigram samples shared by the batch.
    - ``"softmax"``: full softmax cross-entropy.

    Both NCE losses use the self-normalised score ``s = l.w + c - log_z``.
    Evaluate with the full softmax (PPL^f) or with the self-normalised
    probabilities ``exp(s)`` (PPL^n, cheaper: no sum over the vocabulary); see
    ``target_log_probs``.

    Args:
        vocab_size: int, the number of output words ``V``.
        loss: str, ``"bnce"`` (default), ``"snce"`` or ``"softmax"``.
        log_z: float, the fixed log normaliser ``log Z`` of the NCE losses.
        num_noise: int, noise samples per batch for ``"snce"``.
        extra_noise: int, extra shared noise samples per batch for ``"bnce"``
            (adaptive B-NCE; use it for batches of 100 or fewer targets).
        remove_accidental_hits: bool, do not count a row's own word as its
            noise. Default False, the paper's: duplicates stay noise samples,
            so the noise is the unigram.
        noise_scope: str, the batch of ``"bnce"`` for ``[B, T, H]`` inputs:
            ``"time_step"`` (the paper's: the ``B`` targets of one time step,
            ``K = B - 1``, extra noise drawn per step) or ``"batch"`` (all
            ``B x T`` targets pooled, ``K = B T - 1``; neighbouring words of a
            row's own sequence are then among its noise).
        compact_batch: bool, train on the real tokens only: with a ``target_mask``, the padded rows never
            reach the output layer, and ``"bnce"`` over one flat batch (``noise_scope="batch"``, or ``[B, H]``
            inputs) is computed on the batch's distinct real words (``distinct_batch_nce_loss``). The same
            losses and gradients, with less work; the shapes are dynamic, so leave it False when the training
            step runs under XLA (``jit_compile=True``).
        noise_distribution: optional list of ``vocab_size`` noise probabilities
            (> 0, sum 1). Default uniform. For large vocabularies prefer
            ``set_noise_distribution`` after ``build`` (keeps the config small).
        kernel_initializer: initializer of the ``[V, H]`` output embedding.
        bias_initializer: initializer of the ``[V]`` bias.
        seed: optional int seed of the noise sampler.
        **kwargs: other keyword arguments of ``keras.layers.Layer``.

    Call arguments:
        inputs: ``hidden`` of shape ``[B, H]`` or ``[B, T, H]``, or a list
            ``[hidden, targets]`` with int ``targets`` of shape ``[B]`` or
            ``[B, T]`` (B-NCE's batch: see ``noise_scope``; the other losses
            flatten time into the batch).
        training: bool. With targets and ``training=True``, returns the
            per-token training loss of ``loss`` (shape of ``targets``); use it
            with an identity loss. With targets otherwise, returns the
            per-token negative log-likelihood under the full softmax (or the
            self-normalised one), so ``model.evaluate`` reports log PPL.
            Without targets, returns log-probabilities ``[..., V]``.
        self_normalized: bool, at inference use ``s - log_z`` instead of the
            full log-softmax.
        logit_bias: optional ``[..., V]`` scores added to every word's score,
            per row (``hidden``'s leading shape), in training (``"softmax"``,
            ``"bnce"``: the batch's columns get their entries) and at inference;
            for example ``seqapps.layers.lexicon.LexiconBias``. B-NCE's loss and
            the self-normalised scores take it shifted per row by
            ``noise_centred_bias``, which the full softmax does not see. Or
            the lexicon's mixture (``LexiconBias(..., mixture=True)``, for
            ``[B, T, H]`` hidden states): B-NCE's training loss then evaluates
            the bias and its shift at the batch's columns only, never over
            ``V``; everything else takes its dense bias, the same numbers.
        target_mask: optional bool, the shape of the targets, False for padding.
            In training a padded token's loss is 0 and, under ``"bnce"``, it is
            in no other token's noise (``K`` counts the real targets); padding
            is never noise. Evaluation ignores it: weight the tokens instead.

    Example:
    ```python
    hidden = keras.Input((32,))
    targets = keras.Input((), dtype="int32")
    output = BatchNCE(10_000, loss="bnce")
    model = keras.Model([hidden, targets], output([hidden, targets]))
    output.set_noise_distribution(unigram_distribution(counts))
    model.compile("sgd", loss=lambda y_true, y_pred: y_pred)
    model.fit([h, t], np.zeros(len(t)), batch_size=400)
    log_probs = output.target_log_probs(h_valid, t_valid)
    ppl_f, ppl_n = perplexity(log_probs["full"]), perplexity(log_probs["self_normalized"])
    ```

    Reference:
        - [Oualil & Klakow, 2017](https://arxiv.org/abs/1708.05997)
    """

    def __init__(
        self,
        vocab_size: int,
        loss: str = "bnce",
        log_z: float = 9.0,
        num_noise: int = 100,
        extra_noise: int = 0,
        remove_accidental_hits: bool = False,
        noise_scope: str = "time_step",
        compact_batch: bool = False,
        noise_distribution: Sequence[float] | None = None,
        kernel_initializer: Any = "glorot_uniform",
        bias_initializer: Any = "zeros",
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if loss not in LOSSES:
            raise ValueError(f"`loss` must be one of {LOSSES}; got loss={loss!r}")
        if int(vocab_size) < 2:
            raise ValueError(f"`vocab_size` must be >= 2; got vocab_size={vocab_size!r}")
        if int(num_noise) < 1:
            raise ValueError(f"`num_noise` must be >= 1; got num_noise={num_noise!r}")
        if int(extra_noise) < 0:
            raise ValueError(f"`extra_noise` must be >= 0; got extra_noise={extra_noise!r}")
        if noise_scope not in NOISE_SCOPES:
            raise ValueError(f"`noise_scope` must be one of {NOISE_SCOPES}; got noise_scope={noise_scope!r}")
        if noise_distribution is not None:
            noise_distribution = validate_noise_probs(noise_distribution, int(vocab_size)).tolist()
        self.vocab_size = int(vocab_size)
        self.loss = loss
        self.log_z = float(log_z)
        self.num_noise = int(num_noise)
        self.extra_noise = int(extra_noise)
        self.remove_accidental_hits = bool(remove_accidental_hits)
        self.noise_scope = noise_scope
        self.compact_batch = bool(compact_batch)
        self.noise_distribution = noise_distribution
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def build(self, input_shape: Any) -> None:
        hidden_shape = input_shape[0] if isinstance(input_shape[0], (list, tuple)) else input_shape
        probs = (
            np.full(self.vocab_size, 1.0 / self.vocab_size)
            if self.noise_distribution is None
            else np.asarray(self.noise_distribution, dtype="float64")
        )
        self.kernel = self.add_weight(
            name="kernel", shape=(self.vocab_size, hidden_shape[-1]), initializer=self.kernel_initializer
        )
        self.bias = self.add_weight(name="bias", shape=(self.vocab_size,), initializer=self.bias_initializer)
        self.noise_probs = self.add_weight(
            name="noise_probs",
            shape=(self.vocab_size,),
            initializer=keras.initializers.Constant(probs.astype("float32")),
            trainable=False,
        )
        self.noise_cdf = self.add_weight(
            name="noise_cdf",
            shape=(self.vocab_size,),
            initializer=keras.initializers.Constant(np.cumsum(probs).astype("float32")),
            trainable=False,
        )

    def set_noise_distribution(self, noise_probs: Sequence[float] | np.ndarray) -> None:
        """Sets the unigram noise distribution (the layer must be built).

        Args:
            noise_probs: ``[vocab_size]`` probabilities, > 0 and summing to 1
                (see ``unigram_distribution`` for counts).
        """
        probs = validate_noise_probs(noise_probs, self.vocab_size)
        self.noise_probs.assign(probs.astype("float32"))
        self.noise_cdf.assign(np.cumsum(probs).astype("float32"))

    def sample_noise(self, shape: int | tuple) -> tf.Tensor:
        """Draws word ids from the noise distribution (with replacement).

        Args:
            shape: how many ids to draw, or the shape of the draw.

        Returns:
            int32 ids of that shape.
        """
        uniform = keras.random.uniform(shape if isinstance(shape, tuple) else (shape,), seed=self.seed_generator)
        return noise_ids_from_uniform(self.noise_cdf, uniform)

    def training_loss(self, hidden: tf.Tensor, targets: tf.Tensor, logit_bias: Any = None,
                      target_mask: tf.Tensor | None = None) -> tf.Tensor:
        """Per-token training loss of the configured ``loss``.

        Args:
            hidden: ``[B, H]`` or ``[B, T, H]`` hidden states.
            targets: ``[B]`` or ``[B, T]`` int target ids.
            logit_bias: optional ``[..., V]`` scores added to every word's, per row, or a lexical mixture
                (``LexiconBias(..., mixture=True)``, ``[B, T, H]`` hidden states only), of which B-NCE
                evaluates the batch's columns only (``"softmax"`` and ``"bnce"`` only).
            target_mask: optional bool, the shape of ``targets``: False for padding. A padded token's
                loss is 0, and under ``"bnce"`` it is in no other token's noise.

        Returns:
            Float loss, the shape of ``targets``.
        """
        hidden = tf.convert_to_tensor(hidden, dtype=self.compute_dtype)
        targets = tf.cast(targets, "int32")
        if target_mask is not None:
            target_mask = tf.cast(target_mask, tf.bool)
        if logit_bias is not None and self.loss == "snce":
            raise ValueError("`logit_bias` is supported by the 'softmax' and 'bnce' losses, not 'snce'")
        if isinstance(logit_bias, dict) and hidden.shape.rank != 3:
            raise ValueError(f"`logit_bias` as a lexical mixture needs [B, T, H] hidden states; got {hidden.shape}")
        time_major = self.loss == "bnce" and self.noise_scope == "time_step" and hidden.shape.rank == 3
        column_bias = None
        if logit_bias is not None and self.loss == "bnce":
            column_bias = self._centred_column_bias(logit_bias, time_major)
            logit_bias = None
        if time_major:
            steps = tf.shape(hidden)[1]
            extra = self.sample_noise((steps, self.extra_noise)) if self.extra_noise else None
            per_step = batch_nce_loss(
                tf.transpose(hidden, [1, 0, 2]),
                self.kernel,
                self.bias,
                tf.transpose(targets),
                self.noise_probs,
                log_z=self.log_z,
                extra_noise_ids=extra,
                remove_accidental_hits=self.remove_accidental_hits,
                column_bias=column_bias,
                target_mask=None if target_mask is None else tf.transpose(target_mask),
            )
            return tf.transpose(per_step)
        if self.compact_batch and target_mask is not None and self.loss != "bnce":
            return self._real_rows_training_loss(hidden, targets, logit_bias, target_mask)
        logit_bias = self._flat_logit_bias(logit_bias)
        flat = self._flat_training_loss(tf.reshape(hidden, [-1, tf.shape(hidden)[-1]]), tf.reshape(targets, [-1]),
                                        logit_bias, column_bias,
                                        None if target_mask is None else tf.reshape(target_mask, [-1]))
        return tf.reshape(flat, tf.shape(targets))

    def _real_rows_training_loss(self, hidden: tf.Tensor, targets: tf.Tensor, logit_bias: Any,
                                 target_mask: tf.Tensor) -> tf.Tensor:
        """``training_loss`` of the softmax or S-NCE computed on the unmasked tokens only (``compact_batch``).

        Returns:
            Float loss, the shape of ``targets``, 0 at the padding.
        """
        real = tf.cast(tf.reshape(target_mask, [-1]), tf.int32)

        def real_rows(x: tf.Tensor, width: Any) -> tf.Tensor:  # in order, and with a dense gradient (not gather's)
            return tf.dynamic_partition(tf.reshape(x, [-1, width]), real, 2)[1]

        if isinstance(logit_bias, dict):  # a lexical mixture: each real token's own terms, as rows of one step
            weights = logit_bias["weights"]
            entries = tf.shape(weights)[-1]
            ids = tf.broadcast_to(logit_bias["ids"], tf.shape(weights))
            logit_bias = {**logit_bias, "ids": real_rows(ids, entries)[:, tf.newaxis],
                          "weights": real_rows(weights, entries)[:, tf.newaxis]}
        elif logit_bias is not None:
            logit_bias = real_rows(logit_bias, self.vocab_size)
        losses = self._flat_training_loss(real_rows(hidden, tf.shape(hidden)[-1]), real_rows(targets, 1)[:, 0],
                                          self._flat_logit_bias(logit_bias), None, None)
        rows = tf.where(real > 0)
        return tf.reshape(tf.scatter_nd(rows, losses, tf.shape(real, out_type=rows.dtype)), tf.shape(targets))

    def _flat_logit_bias(self, logit_bias: Any) -> tf.Tensor | None:
        """The ``[N, V]`` rows of a dense ``logit_bias`` or of a lexical mixture (densified); None for None."""
        if logit_bias is None:
            return None
        dense = lexical_log_bias(logit_bias, self.vocab_size) if isinstance(logit_bias, dict) else logit_bias
        return tf.reshape(dense, [-1, self.vocab_size])

    def _centred_column_bias(self, logit_bias: Any, time_major: bool) -> Callable[[tf.Tensor], tf.Tensor]:
        """B-NCE's ``column_bias``: the bias centred by ``noise_centred_bias``, at the batch's columns.

        A lexical mixture is evaluated at the columns only, and its centring term is exact without ``V``
        (``lexical_log_noise_mass``); a dense bias is centred over ``V`` and gathered.

        Args:
            logit_bias: ``[B, (T,) V]`` scores, or a lexical mixture of ``[B, T]`` rows.
            time_major: the columns are one set per time step (``[T, M]``, rows ``[T, B]``); otherwise one set
                for every row of the flattened batch (``[M]``, rows ``[B T]``).

        Returns:
            A function of the columns that returns the rows' centred bias of each, ``[T, B, M]`` or ``[N, M]``.
        """
        if not isinstance(logit_bias, dict):
            centred = noise_centred_bias(tf.cast(logit_bias, self.compute_dtype), self.noise_probs)
            return dense_column_bias(tf.transpose(centred, [1, 0, 2]) if time_major
                                     else tf.reshape(centred, [-1, self.vocab_size]))
        log_mass = tf.cast(lexical_log_noise_mass(logit_bias, self.noise_probs), self.compute_dtype)

        def at_columns(columns: tf.Tensor) -> tf.Tensor:
            centred = tf.cast(lexical_log_bias_at_columns(logit_bias, columns), self.compute_dtype)
            centred -= log_mass[..., tf.newaxis]  # [B, T, M]
            if time_major:
                return tf.transpose(centred, [1, 0, 2])
            return tf.reshape(centred, [-1, tf.shape(centred)[-1]])

        return at_columns

    def _flat_training_loss(self, hidden: tf.Tensor, targets: tf.Tensor, logit_bias: tf.Tensor | None,
                            column_bias: Callable[[tf.Tensor], tf.Tensor] | None,
                            target_mask: tf.Tensor | None) -> tf.Tensor:
        """``training_loss`` of ``[N, H]`` hidden states and ``[N]`` targets as one batch.

        The softmax takes a dense ``[N, V]`` ``logit_bias``, B-NCE its ``column_bias`` (``[M]`` columns -> ``[N, M]``).
        """
        if self.loss == "bnce":
            return (distinct_batch_nce_loss if self.compact_batch else batch_nce_loss)(
                hidden,
                self.kernel,
                self.bias,
                targets,
                self.noise_probs,
                log_z=self.log_z,
                extra_noise_ids=self.sample_noise(self.extra_noise) if self.extra_noise else None,
                remove_accidental_hits=self.remove_accidental_hits,
                column_bias=column_bias,
                target_mask=target_mask,
            )
        if self.loss == "softmax":
            losses = softmax_loss(hidden, self.kernel, self.bias, targets, logit_bias)
        else:
            losses = sampled_nce_loss(
                hidden,
                self.kernel,
                self.bias,
                targets,
                self.noise_probs,
                self.sample_noise(self.num_noise),
                log_z=self.log_z,
                remove_accidental_hits=self.remove_accidental_hits,
            )
        return losses if target_mask is None else tf.where(target_mask, losses, tf.zeros_like(losses))

    def target_log_probs(self, hidden: Any, targets: Any, logit_bias: Any = None) -> dict[str, tf.Tensor]:
        """Log-probabilities of the targets under both normalisations, for PPL^f and PPL^n.

        Args:
            hidden: ``[..., H]`` hidden states.
            targets: int target ids, the shape of ``hidden`` without its last axis.
            logit_bias: optional ``[..., V]`` scores added to every word's, per row, or a lexical mixture.

        Returns:
            Dict with ``"full"`` (log-softmax over the vocabulary) and
            ``"self_normalized"`` (``s - log_z``), each the shape of ``targets``.
        """
        hidden = tf.convert_to_tensor(hidden, dtype=self.compute_dtype)
        targets = tf.convert_to_tensor(targets)
        flat_hidden = tf.reshape(hidden, [-1, tf.shape(hidden)[-1]])
        flat_targets = tf.reshape(targets, [-1])
        flat_bias = self._flat_logit_bias(logit_bias)
        full = -softmax_loss(flat_hidden, self.kernel, self.bias, flat_targets, flat_bias)
        if flat_bias is not None:
            flat_bias = noise_centred_bias(tf.cast(flat_bias, self.compute_dtype), self.noise_probs)
        score = (
            tf.reduce_sum(flat_hidden * tf.gather(self.kernel, flat_targets), axis=1)
            + tf.gather(self.bias, flat_targets)
            - self.log_z
        )
        if flat_bias is not None:
            score += tf.gather(flat_bias, flat_targets, batch_dims=1)
        return {
            "full": tf.reshape(full, tf.shape(targets)),
            "self_normalized": tf.reshape(score, tf.shape(targets)),
        }

    def call(self, inputs: Any, training: bool | None = None, self_normalized: bool = False,
             logit_bias: Any = None, target_mask: Any = None) -> tf.Tensor:
        if isinstance(inputs, (list, tuple)):
            hidden, targets = inputs
        else:
            hidden, targets = inputs, None
        hidden = tf.convert_to_tensor(hidden, dtype=self.compute_dtype)
        if targets is None:
            flat_hidden = tf.reshape(hidden, [-1, tf.shape(hidden)[-1]])
            flat_bias = self._flat_logit_bias(logit_bias)
            if flat_bias is not None and self_normalized:
                flat_bias = noise_centred_bias(tf.cast(flat_bias, self.compute_dtype), self.noise_probs)
            logits = full_logits(flat_hidden, self.kernel, self.bias, flat_bias)
            log_probs = logits - self.log_z if self_normalized else tf.nn.log_softmax(logits)
            return tf.reshape(log_probs, tf.concat([tf.shape(hidden)[:-1], [self.vocab_size]], axis=0))
        targets = tf.cast(targets, "int32")
        if training:
            return self.training_loss(hidden, targets, logit_bias, target_mask)
        log_probs = self.target_log_probs(hidden, targets, logit_bias)
        return -log_probs["self_normalized" if self_normalized else "full"]

    def compute_output_shape(self, input_shape: Any) -> tuple[int | None, ...]:
        if isinstance(input_shape[0], (list, tuple)):
            return tuple(input_shape[1])
        return tuple(input_shape[:-1]) + (self.vocab_size,)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            {
                "vocab_size": self.vocab_size,
                "loss": self.loss,
                "log_z": self.log_z,
                "num_noise": self.num_noise,
                "extra_noise": self.extra_noise,
                "remove_accidental_hits": self.remove_accidental_hits,
                "noise_scope": self.noise_scope,
                "compact_batch": self.compact_batch,
                "noise_distribution": self.noise_distribution,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "seed": self.seed,
            }
        )
        return config
