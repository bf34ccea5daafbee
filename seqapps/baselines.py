"""Baselines a practitioner would use instead of an RNN.

Forecasting: ridge regression and Holt-Winters. Both follow the protocol of the forecasting
pipelines: hyperparameters are chosen on the validation split, the final fit sees the training
and validation splits only, and forecasts are made from every test origin for the whole horizon.

Translation: word-by-word lexical translation with IBM Model 1 (``LexicalTranslator``), whose
table is also the lexicon bias of the translation model.
"""
from __future__ import annotations

import dataclasses
import functools
import operator
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import numpy as np

from seqapps.metrics import lagged_values

if TYPE_CHECKING:
    from seqapps.data.text import Vocabulary

RIDGE_ALPHAS = tuple(np.logspace(-4, 3, 15))

Batches = Callable[[int], Iterable[tuple[np.ndarray, np.ndarray]]]
"""``batches(first)``: a new iterator of ``(features [B, F], targets [B, outputs])`` batches over rows
``first`` onwards, in order."""


@dataclasses.dataclass
class LinearFit:
    """A linear map ``features @ coef + intercept``.

    Attributes:
        coef: weights, shape [features, outputs].
        intercept: shape [outputs].
    """

    coef: np.ndarray
    intercept: np.ndarray

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Returns ``features @ coef + intercept``, shape [N, outputs]."""
        return features @ self.coef + self.intercept


@dataclasses.dataclass
class RidgeFit(LinearFit):
    """A ridge regression fitted by ``fit_ridge``: the fit on the training and validation rows.

    Attributes:
        alpha: the penalty chosen on the validation split.
        val_mae: the validation MAE of ``train``.
        train: the fit on the training rows alone with ``alpha``: its validation forecasts are
            out of sample (for calibrating intervals).
        edges: the row edges of the cross-fitting blocks, shape [folds + 1] (empty without).
        folds: block k's fit with ``alpha`` on the rows outside it and its gaps (cross-fitting).
    """

    alpha: float
    val_mae: float
    train: LinearFit
    edges: np.ndarray
    folds: list[LinearFit]

    def blocks(self, rows: np.ndarray) -> np.ndarray:
        """The cross-fitting block of each row index, shape [N]."""
        return np.searchsorted(self.edges, rows, side="right") - 1

    def out_of_fold_shift(self, features: Any, blocks: Any) -> Any:
        """This fit's forecast minus the forecast of the fit that left each row's block out, in float64.

        Each row is multiplied by its own block's coefficients only: the rows are partitioned by
        block, each part goes through its block's fit, and the parts are put back in row order.
        Works on NumPy arrays and on tensors in a graph: a ``tf.data`` map shifts training targets
        by it, so that they are the out-of-fold residuals.

        Args:
            features: shape [N, F].
            blocks: each row's cross-fitting block (see ``blocks``), integers [N].

        Returns:
            A float64 tensor, shape [N, outputs].
        """
        import tensorflow as tf

        features = tf.cast(features, tf.float64)
        blocks = tf.cast(blocks, tf.int32)
        parts = tf.dynamic_partition(features, blocks, len(self.folds))
        rows = tf.dynamic_partition(tf.range(tf.shape(features)[0]), blocks, len(self.folds))
        return tf.dynamic_stitch(rows, [part @ (self.coef - fold.coef) + (self.intercept - fold.intercept)
                                        for part, fold in zip(parts, self.folds)])


@dataclasses.dataclass
class Moments:
    """The count, means and centred cross-products of rows of features x and targets y.

    These are what a ridge fit with an intercept needs; they combine exactly (Chan et al.'s
    pairwise update), so moments of a union or a difference of row sets follow from the parts'.

    Attributes:
        count: the number of rows.
        mean_x: shape [F]; mean_y: shape [outputs].
        xx: the centred x'x, shape [F, F]; xy: the centred x'y, shape [F, outputs].
    """

    count: int
    mean_x: np.ndarray
    mean_y: np.ndarray
    xx: np.ndarray
    xy: np.ndarray

    @classmethod
    def of(cls, x: np.ndarray, y: np.ndarray) -> "Moments":
        """The moments of rows ``x`` [N, F] and ``y`` [N, outputs], in float64."""
        x, y = np.asarray(x, "float64"), np.asarray(y, "float64")
        mean_x, mean_y = x.mean(axis=0), y.mean(axis=0)
        x = x - mean_x
        return cls(len(x), mean_x, mean_y, x.T @ x, x.T @ (y - mean_y))

    def __add__(self, other: "Moments") -> "Moments":
        if not other.count:
            return self
        if not self.count:
            return other
        count = self.count + other.count
        dx, dy = other.mean_x - self.mean_x, other.mean_y - self.mean_y
        weight = self.count * other.count / count
        return Moments(count, self.mean_x + dx * other.count / count, self.mean_y + dy * other.count / count,
                       self.xx + other.xx + weight * np.outer(dx, dx), self.xy + other.xy + weight * np.outer(dx, dy))

    def __sub__(self, other: "Moments") -> "Moments":
        """The moments of this set's rows that are not ``other``'s (``other`` must be a subset)."""
        if not other.count:
            return self
        count = self.count - other.count
        mean_x = (self.count * self.mean_x - other.count * other.mean_x) / count
        mean_y = (self.count * self.mean_y - other.count * other.mean_y) / count
        dx, dy = other.mean_x - mean_x, other.mean_y - mean_y
        weight = count * other.count / self.count
        return Moments(count, mean_x, mean_y, self.xx - other.xx - weight * np.outer(dx, dx),
                       self.xy - other.xy - weight * np.outer(dx, dy))

    def solve(self, alphas: Sequence[float]) -> list[LinearFit]:
        """The ridge fits with an intercept (scikit-learn's ``Ridge(alpha)``) for each penalty.

        The features and targets are centred, so the intercept is not penalised; one
        eigendecomposition of x'x serves every penalty.
        """
        values, vectors = np.linalg.eigh(self.xx)
        projected = vectors.T @ self.xy
        fits = []
        for alpha in alphas:
            coef = vectors @ (projected / (values + alpha)[:, None])
            fits.append(LinearFit(coef, self.mean_y - self.mean_x @ coef))
        return fits


def _segment_moments(batches: Batches, cuts: list[int]) -> list[Moments]:
    """The moments of the rows between each pair of consecutive ``cuts`` (which start at 0)."""
    segments = [None] * (len(cuts) - 1)
    first = 0
    for x, y in batches(0):
        last = first + len(x)
        for k in range(len(segments)):
            start, stop = max(cuts[k], first), min(cuts[k + 1], last)
            if start < stop:
                part = Moments.of(x[start - first: stop - first], y[start - first: stop - first])
                segments[k] = part if segments[k] is None else segments[k] + part
        first = last
    if first != cuts[-1]:
        raise ValueError(f"the batches hold {first} rows, expected {cuts[-1]}")
    return segments


def fit_ridge(batches: Batches, n_train: int, n_val: int, alphas: Sequence[float] = RIDGE_ALPHAS,
              folds: int = 0, gap: int = 0) -> RidgeFit:
    """Chooses the ridge penalty by validation MAE, then refits on train + validation.

    Solved from x'x and x'y, accumulated in float64 batch by batch, so memory does not
    grow with the rows; the fits equal scikit-learn's ``Ridge(alpha)`` (an unpenalised
    intercept) to float round-off.

    Args:
        batches: the training rows, then the validation rows (see ``Batches``); read twice: all
            rows, then the validation rows.
        n_train, n_val: how many rows are the training and the validation split.
        alphas: the penalties to try.
        folds: with K > 1, also fit each of K contiguous blocks of all rows on the other rows (cross-fitting).
        gap: rows left out of a block's fit on each side of it: the rows are forecast windows in
            time order, whose targets overlap their neighbours'.

    Returns:
        The fit on all rows with the best penalty, with the training-only and block fits.
    """
    rows = n_train + n_val
    edges = np.linspace(0, rows, folds + 1).round().astype(int) if folds > 1 else np.zeros(0, int)
    held_out = [(max(start - gap, 0), min(stop + gap, rows)) for start, stop in zip(edges[:-1], edges[1:])]
    cuts = sorted({0, n_train, rows, *(bound for pair in held_out for bound in pair)})
    segments = _segment_moments(batches, cuts)

    def moments(start: int, stop: int) -> Moments:
        return functools.reduce(operator.add, segments[cuts.index(start): cuts.index(stop)])

    candidates = moments(0, n_train).solve(alphas)
    coef = np.stack([fit.coef for fit in candidates], axis=1)  # [F, alphas, outputs]
    intercept = np.stack([fit.intercept for fit in candidates])
    errors = np.zeros(len(alphas))
    for x, y in batches(n_train):
        forecast = (np.asarray(x, "float64") @ coef.reshape(len(coef), -1)).reshape(len(x), *intercept.shape)
        errors += np.abs(forecast + intercept - np.asarray(y, "float64")[:, None]).sum(axis=(0, 2))
    best = int(np.argmin(errors))  # the first of equals, as a scan would keep
    alpha = alphas[best]
    total = moments(0, rows)
    final = total.solve([alpha])[0]
    fold_fits = []
    for k, (start, stop) in enumerate(held_out):
        if stop - start == rows:
            raise ValueError(f"cross-fitting block {k + 1} of {folds} and its gaps of {gap} rows cover all {rows} rows")
        fold_fits.append((total - moments(start, stop)).solve([alpha])[0])
    return RidgeFit(final.coef, final.intercept, float(alpha), float(errors[best] / (n_val * intercept.shape[1])),
                    candidates[best], edges, fold_fits)


Windows = Callable[[np.ndarray], Iterable[tuple[Any, np.ndarray]]]
"""``windows(origins)``: a new iterator of ``(inputs, truth [B, horizon, targets])`` batches of the windows at
``origins``, in order."""


@dataclasses.dataclass
class BaseRidge:
    """A ridge forecast on top of a base forecast, fitted and applied batch by batch over windows.

    It forecasts ``(ridge(features) + base) * std + mean``: ``extract`` gives each batch's features
    and its base forecast in standardised units, and the ridge is fitted on the standardised truth
    minus the base. No [windows, features] array is held.

    Attributes:
        fit: the ridge (``fit_ridge``) of the flattened [horizon x targets] outputs.
        extract: a batch's inputs -> ``(features [B, F], base [B, horizon x targets] or 0.0)``.
        windows: see ``Windows``.
        mean, std: the targets' standardisation, [targets].
    """

    fit: RidgeFit
    extract: Callable[[Any], tuple[np.ndarray, np.ndarray | float]]
    windows: Windows
    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fitted(cls, extract: Callable[[Any], tuple[np.ndarray, np.ndarray | float]], windows: Windows,
               origins: np.ndarray, n_train: int, mean: np.ndarray, std: np.ndarray, folds: int = 0,
               gap: int = 0) -> "BaseRidge":
        """Fits the ridge on the windows at ``origins``: the first ``n_train`` train, the rest validate.

        Args:
            extract, windows, mean, std: as the attributes.
            origins: the training then the validation windows.
            n_train: how many of them are training windows.
            folds, gap: cross-fitting, as in ``fit_ridge``.
        """
        def batches(first: int) -> Iterable[tuple[np.ndarray, np.ndarray]]:
            for inputs, truth in windows(origins[first:]):
                features, base = extract(inputs)
                yield features, ((truth - mean) / std).reshape(len(features), -1) - base

        fit = fit_ridge(batches, n_train, len(origins) - n_train, folds=folds, gap=gap)
        return cls(fit, extract, windows, np.asarray(mean), np.asarray(std))

    def forecast(self, origins: np.ndarray) -> np.ndarray:
        """The forecasts of the windows at ``origins`` in user units, float32 [N, horizon, targets]."""
        return self._outputs(origins, lambda features, base: (self.fit.predict(features) + base, self.mean))

    def train_only_shift(self, origins: np.ndarray) -> np.ndarray:
        """What the fit on the training windows alone adds to ``forecast`` (user units, float32 [N, horizon, targets]):
        the validation windows' out-of-sample forecast is their ``forecast`` plus it."""
        fit = self.fit
        return self._outputs(origins, lambda features, _: (fit.train.predict(features) - fit.predict(features), 0.0))

    def _outputs(self, origins: np.ndarray, output: Callable[[np.ndarray, Any], tuple[np.ndarray, Any]]) -> np.ndarray:
        """``scaled * std + offset`` for ``(scaled, offset) = output(features, base)`` of each batch, written
        into one float32 array (a long series' test split holds millions of values)."""
        found, first = np.empty((len(origins), self.fit.coef.shape[1] // len(self.std), len(self.std)), "float32"), 0
        for inputs, truth in self.windows(origins):
            scaled, offset = output(*self.extract(inputs))
            found[first: first + len(truth)] = scaled.reshape(truth.shape) * self.std + offset
            first += len(truth)
        return found


def fit_window_ridge(extractor: Any, windows: Windows, origins: dict[str, np.ndarray], mean: np.ndarray,
                     std: np.ndarray, folds: int, horizon: int) -> dict[str, Any]:
    """Fits the ridge baseline on the residual to the seasonal-naive base (``BaseRidge``) over a series' windows.

    Args:
        extractor: a Keras model of a batch's inputs to the ridge's features [B, F] and, if it has one, its
            base [B, horizon x targets] in standardised units (``seqapps.forecaster.ridge_extractor``).
        windows: see ``Windows``.
        origins: the "train", "val" and "test" windows' last observed steps; the ridge fits on the first two.
        mean, std: the targets' standardisation, [targets].
        folds: cross-fitting blocks (``fit_ridge``; 0 or 1: none), with gaps of a ``horizon`` either side.
        horizon: the forecast's steps.

    Returns:
        ``ridge`` (the fit), ``ridge_forecast`` (the test windows' forecasts), ``ridge_val_shift`` (what the
        training-only fit adds on the validation windows) and, with ``folds`` > 1, ``ridge_target_shift``: a
        function of a batch's inputs and blocks that gives the full fit's forecast minus the block's fit's
        (user units, a tensor [B, horizon, targets]).
    """
    import tensorflow as tf

    from seqapps import compat

    predict = compat.batch_predictor(extractor)

    def extract(batch: dict[str, Any]) -> tuple[np.ndarray, np.ndarray | float]:
        features, *base_values = [part.numpy() for part in tf.nest.flatten(predict(batch))]
        return features, base_values[0] if base_values else 0.0

    ridge = BaseRidge.fitted(extract, windows, np.concatenate([origins["train"], origins["val"]]),
                             len(origins["train"]), mean, std, folds=folds, gap=horizon)
    found = {"ridge": ridge.fit, "ridge_forecast": ridge.forecast(origins["test"]),
             "ridge_val_shift": ridge.train_only_shift(origins["val"])}
    if folds > 1:
        shape = (-1, horizon, len(std))
        found["ridge_target_shift"] = lambda batch, blocks: tf.reshape(ridge.fit.out_of_fold_shift(
            tf.nest.flatten(extractor(batch, training=False))[0], blocks), shape) * std
    return found


def holt_winters(series: np.ndarray, fit_end: int, origins: np.ndarray, horizon: int, period: int,
                 out: np.ndarray | None = None) -> np.ndarray:
    """Additive Holt-Winters (ETS(A,N,A)) forecasts from many origins, with statsmodels.

    The parameters and initial states are fitted on ``series[:fit_end]``. The model is
    then run with them over the whole series, which only filters forward, so the
    forecast from origin t uses the values up to t alone.

    Args:
        series: values, shape [T].
        fit_end: the number of leading values the parameters are fitted on.
        origins: indices of the last observed step of each forecast, shape [N].
        horizon: steps ahead.
        period: the season length in steps.
        out: a float64 array [N, horizon] to write the forecasts into; None: a new one.

    Returns:
        Forecasts of shape [N, horizon] (``out`` if given).
    """
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter; the fit is judged by its test error
        fitted = ExponentialSmoothing(series[:fit_end], seasonal="add", seasonal_periods=period,
                                      initialization_method="estimated").fit()
        params = fitted.params
        states = ExponentialSmoothing(series, seasonal="add", seasonal_periods=period,
                                      initialization_method="known", initial_level=params["initial_level"],
                                      initial_seasonal=params["initial_seasons"]).fit(
            smoothing_level=params["smoothing_level"], smoothing_seasonal=params["smoothing_seasonal"],
            optimized=False)
    level, season = np.asarray(states.level), np.asarray(states.season)
    steps = np.arange(1, horizon + 1)
    # Last season's value of each step, plus the level, added in place: a long test split's forecasts are
    # hundreds of MB, so no index or sum array of their size is made beside them.
    forecast = lagged_values(season, origins, period * ((steps - 1) // period + 1) - steps, out)
    forecast += level[origins][:, None]
    return forecast


NULL = "<null>"  # the empty source word of IBM Model 1, which absorbs target words with no source word


@dataclasses.dataclass
class LexicalTranslator:
    """Word-by-word translation: each source word becomes its likeliest target word under IBM Model 1.

    IBM Model 1 (Brown et al. 1993) estimates ``t(target word | source word)`` by EM over the training
    pairs, every target word aligned to one source word or to ``NULL``. ``translate`` writes, for each
    source word, the target word of highest ``t``; unseen source words are copied (names, numbers).
    ``lexicon`` gives the ``top_k`` likeliest translations of every vocabulary word as id and
    probability arrays, the table of the model's lexicon bias (``LexiconBias``).

    Attributes:
        translations: source word -> its ``top_k`` likeliest ``(target word, t)``, likeliest first.
    """

    translations: dict[str, list[tuple[str, float]]]

    @functools.cached_property
    def table(self) -> dict[str, str]:
        """Source word -> its likeliest target word."""
        return {word: found[0][0] for word, found in self.translations.items()}

    @classmethod
    def fit(cls, sources: Sequence[Sequence[str]], targets: Sequence[Sequence[str]],
            iterations: int = 5, top_k: int = 1) -> "LexicalTranslator":
        """Runs EM for IBM Model 1 from uniform translation probabilities.

        Args:
            sources, targets: the training pairs as token lists.
            iterations: EM iterations (5 is the usual number; the likelihood rises monotonically).
            top_k: translations kept per source word.

        Returns:
            The translator.
        """
        source_words = sorted({word for sentence in sources for word in sentence} | {NULL})
        target_words = sorted({word for sentence in targets for word in sentence})
        source_index = {word: i for i, word in enumerate(source_words)}
        target_index = {word: i for i, word in enumerate(target_words)}
        # Every (source position, target position) link of every pair, as flat arrays: a target
        # position's links share one ``position`` id, over which its alignment posterior is normalised.
        link_source, link_target, link_position, offset = [], [], [], 0
        for source, target in zip(sources, targets):
            if not target:
                continue
            s = np.array([source_index[NULL]] + [source_index[w] for w in source], "int64")
            t = np.array([target_index[w] for w in target], "int64")
            link_source.append(np.tile(s, len(t)))
            link_target.append(np.repeat(t, len(s)))
            link_position.append(np.repeat(np.arange(offset, offset + len(t)), len(s)))
            offset += len(t)
        link_source, link_target = np.concatenate(link_source), np.concatenate(link_target)
        link_position = np.concatenate(link_position)
        pair_ids, link_pair = np.unique(link_source * len(target_words) + link_target, return_inverse=True)
        pair_source, pair_target = pair_ids // len(target_words), pair_ids % len(target_words)
        probs = np.full(len(pair_ids), 1.0 / len(target_words))
        for _ in range(iterations):
            link_probs = probs[link_pair]
            posterior = link_probs / np.bincount(link_position, link_probs)[link_position]
            expected = np.bincount(link_pair, posterior, minlength=len(pair_ids))
            probs = expected / np.bincount(pair_source, expected, minlength=len(source_words))[pair_source]
        order = np.lexsort((-probs, pair_source))  # by source word, likeliest target first
        starts = np.r_[True, pair_source[order][1:] != pair_source[order][:-1]]
        rank = np.arange(len(order)) - np.maximum.accumulate(np.where(starts, np.arange(len(order)), 0))
        translations: dict[str, list[tuple[str, float]]] = {}
        for pair in order[rank < top_k]:
            word = source_words[pair_source[pair]]
            if word != NULL:
                translations.setdefault(word, []).append((target_words[pair_target[pair]], float(probs[pair])))
        return cls(translations)

    def lexicon(self, source_vocab: Vocabulary, target_vocab: Vocabulary,
                top_k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``top_k`` likeliest target ids of every source vocabulary word, for ``LexiconBias``.

        Target words outside the vocabulary count as ``<unk>`` (their probabilities add up); words
        without translations (the special tokens, ``<unk>``) get empty rows.

        Args:
            source_vocab, target_vocab: the model's vocabularies.
            top_k: entries per source word.

        Returns:
            ``(ids, probs)``: int32 and float32 ``[len(source_vocab), top_k]``, likeliest first, unused
            entries with probability 0.
        """
        ids = np.zeros((len(source_vocab), top_k), "int32")
        probs = np.zeros((len(source_vocab), top_k), "float32")
        for row, word in enumerate(source_vocab.tokens):
            merged: dict[int, float] = {}
            for target, prob in self.translations.get(word, []):
                merged[target_vocab.id(target)] = merged.get(target_vocab.id(target), 0.0) + prob
            best = sorted(merged.items(), key=lambda item: -item[1])[:top_k]
            ids[row, : len(best)] = [target for target, _ in best]
            probs[row, : len(best)] = [prob for _, prob in best]
        return ids, probs

    def translate(self, tokens: Sequence[str]) -> list[str]:
        """Translates a token list word by word (unseen words are copied).

        Args:
            tokens: the source tokens.

        Returns:
            One target token per source token.
        """
        return [self.table.get(token, token) for token in tokens]
