"""A character n-gram language model that a CTC beam search reads in the graph (shallow fusion).

``CharNgramLM`` counts the character n-grams of a set of transcripts (scikit-learn's
``CountVectorizer``) and smooths them by interpolated Witten-Bell (Witten & Bell 1991; the
form of Chen & Goodman 1999, section 2.4): for a context ``h`` seen ``N(h)`` times, followed by
``T(h)`` distinct symbols,

    P(c | h) = (N(h c) + T(h) P(c | h')) / (N(h) + T(h)),

where ``h'`` is ``h`` without its oldest symbol; an unseen context passes ``P(c | h')`` through,
and the order-0 model is uniform over the symbols. The counts are held as sorted ``int64`` keys
and ``float32`` values in variables, so a SavedModel keeps them and a lookup is one
``tf.searchsorted``: no table resource to initialise, nothing outside core ops.

Symbols are the CTC model's class ids: ``1..C-1`` the characters, ``0`` (the blank, which is never
a character) the padding before a sentence's first character, and ``C`` the end of the sentence.
A context is the last ``order - 1`` symbols as one base-``C + 1`` number (``next_context``).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

MAX_ORDER = 15  # a key holds the n-gram's order in its lowest 4 bits
_ORDER_SLOTS = 16  # a key is (context code, symbol) * _ORDER_SLOTS + order
_START, _END = "\x02", "\x03"  # stand-ins for the start padding and the end symbol while counting


def max_order(num_classes: int) -> int:
    """The highest order whose keys fit an int64 with ``num_classes`` classes (at most ``MAX_ORDER``)."""
    order = 0
    while order < MAX_ORDER and float(num_classes + 1) ** (order + 1) * _ORDER_SLOTS < 2.0 ** 62:
        order += 1
    return order


class CharNgramLM(tf.Module):
    """Interpolated Witten-Bell character n-grams over a CTC model's classes.

    Args:
        texts: the transcripts to count (each character one of ``chars[1:]``).
        chars: the text of each class (``chars[0]`` the blank's, "").
        order: n, the longest n-gram (1 to ``MAX_ORDER``).
        name: the module's name.

    Raises:
        ValueError: an order out of range, too many classes for its keys, or a character outside ``chars``.
    """

    def __init__(self, texts: Sequence[str], chars: Sequence[str], order: int, name: str | None = None) -> None:
        super().__init__(name=name)
        if not 1 <= order <= max_order(len(chars)):
            raise ValueError(f"order {order} with {len(chars)} classes: expected 1 to {max_order(len(chars))}")
        self.order = order
        self.num_classes = len(chars)
        self.base = len(chars) + 1
        ngrams, counts = _count(texts, chars, order)
        keys, counts, context_keys, context_totals, context_types = _tables(ngrams, counts, chars)
        self.ngram_keys = tf.Variable(keys, trainable=False, name="ngram_keys")
        self.ngram_counts = tf.Variable(counts, trainable=False, name="ngram_counts")
        self.context_keys = tf.Variable(context_keys, trainable=False, name="context_keys")
        self.context_totals = tf.Variable(context_totals, trainable=False, name="context_totals")
        self.context_types = tf.Variable(context_types, trainable=False, name="context_types")

    @property
    def end(self) -> int:
        """The end-of-sentence symbol."""
        return self.num_classes

    def next_context(self, contexts: tf.Tensor, symbols: tf.Tensor) -> tf.Tensor:
        """The contexts after ``symbols`` follow ``contexts`` (both int64, the same shape); 0 is a sentence's start."""
        return (contexts * self.base + tf.cast(symbols, tf.int64)) % (self.base ** (self.order - 1))

    def next_log_probs(self, contexts: tf.Tensor) -> tf.Tensor:
        """Log-probabilities of every symbol after each context.

        Args:
            contexts: int64 [...], from ``next_context`` (0: a sentence's start).

        Returns:
            float32 [..., C + 1]: column ``c`` for class ``c``, column ``C`` the end of the sentence;
            column 0 (the blank, never predicted) is ``-inf``. Each row's exp sums to 1.
        """
        contexts = tf.cast(contexts, tf.int64)
        symbols = tf.range(1, self.base, dtype=tf.int64)  # the characters and the end
        probs = tf.fill(tf.concat([tf.shape(contexts), [self.base - 1]], 0), 1.0 / (self.base - 1))
        for order in range(1, self.order + 1):
            context = contexts % (self.base ** (order - 1))  # the last order - 1 symbols
            seen = _Found(self.context_keys, context * _ORDER_SLOTS + order)  # one search for both of its values
            total, types = seen.value(self.context_totals)[..., None], seen.value(self.context_types)[..., None]
            count = _Found(self.ngram_keys, (context[..., None] * self.base + symbols) * _ORDER_SLOTS + order).value(
                self.ngram_counts)
            probs = tf.where(total > 0, (count + types * probs) / tf.maximum(total + types, 1.0), probs)
        blank = tf.fill(tf.concat([tf.shape(contexts), [1]], 0), -np.inf)
        return tf.concat([blank, tf.math.log(probs)], axis=-1)


class _Found:
    """Where each query sits in sorted int64 ``keys``: one ``tf.searchsorted``, read for any array of values.

    Args:
        keys: sorted, int64.
        query: int64, any shape.
    """

    def __init__(self, keys: tf.Variable, query: tf.Tensor) -> None:
        flat = tf.reshape(query, [1, -1])
        self.position = tf.minimum(tf.searchsorted(keys[None, :], flat)[0], tf.size(keys, out_type=tf.int32) - 1)
        self.found = tf.gather(keys, self.position) == flat[0]
        self.shape = tf.shape(query)

    def value(self, values: tf.Variable) -> tf.Tensor:
        """``values[i]`` where ``keys[i]`` equals the query, else 0, in the query's shape."""
        return tf.reshape(tf.where(self.found, tf.gather(values, self.position), 0.0), self.shape)


def _count(texts: Sequence[str], chars: Sequence[str], order: int) -> tuple[list[str], np.ndarray]:
    """Every n-gram (n = 1..order) of the padded texts that ends on a character or the end, with its count."""
    from sklearn.feature_extraction.text import CountVectorizer

    known = set(chars[1:])
    for text in texts:
        unknown = set(text) - known
        if unknown:
            raise ValueError(f"the transcript {text!r} holds {''.join(sorted(unknown))!r}, outside the characters")
    padded = [_START * (order - 1) + text + _END for text in texts]
    if not padded:
        return [], np.zeros(0, np.int64)
    counter = CountVectorizer(analyzer="char", ngram_range=(1, order), lowercase=False, strip_accents=None)
    matrix = counter.fit_transform(padded)
    totals = np.asarray(matrix.sum(axis=0)).ravel()
    grams = counter.get_feature_names_out()
    keep = [i for i, gram in enumerate(grams) if gram[-1] != _START]
    return [grams[i] for i in keep], totals[keep].astype(np.int64)


def _tables(ngrams: list[str], counts: np.ndarray,
            chars: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The n-grams' sorted keys and their counts, and each context's sorted key, total count and distinct followers.

    With no n-gram (no text), each table holds one key that no query makes (-1) with a count of 0.
    """
    if not ngrams:
        none = np.array([-1], np.int64), np.zeros(1, np.float32)
        return (*none, *none, np.zeros(1, np.float32))
    base = len(chars) + 1
    symbol = {c: i for i, c in enumerate(chars) if i}
    symbol.update({_START: 0, _END: len(chars)})
    contexts = np.zeros(len(ngrams), np.int64)
    keys = np.zeros(len(ngrams), np.int64)
    for i, gram in enumerate(ngrams):
        code = 0
        for c in gram[:-1]:
            code = code * base + symbol[c]
        contexts[i] = code * _ORDER_SLOTS + len(gram)
        keys[i] = (code * base + symbol[gram[-1]]) * _ORDER_SLOTS + len(gram)
    by_key = np.argsort(keys)
    context_keys, which = np.unique(contexts, return_inverse=True)
    totals = np.bincount(which, weights=counts, minlength=context_keys.size).astype(np.float32)
    types = np.bincount(which, minlength=context_keys.size).astype(np.float32)
    return keys[by_key], counts[by_key].astype(np.float32), context_keys, totals, types
