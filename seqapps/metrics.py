"""Task metrics, each a thin, tested wrapper of a well-kept library.

- Forecasting: MAE (also per lead time), RMSE, sMAPE and MASE (plain NumPy, chunk by chunk: a long series' test split holds
  millions of values), and seasonal-naive forecasts.
- Translation: corpus BLEU and chrF (sacrebleu), with sacrebleu's signature string.
- Speech recognition: corpus WER and CER (jiwer).
- Tagging: ROC-AUC and PR-AUC, macro, micro and per label (scikit-learn).
- Language modelling: perplexity, bits per character and the unigram baseline.

Arguments go truth first, as in scikit-learn: ``(references, hypotheses)`` and
``(y_true, y_score)``. sacrebleu and jiwer are imported inside the functions, so
``import seqapps.metrics`` stays light.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence

import numpy as np

CHUNK = 1 << 20  # values per work array of the forecast metrics
#: Why a metric defined here can be NaN, by its key (``nan_reason`` reads it): ``forecast_metrics`` returns
#: NaN for MASE exactly when its scale is 0.
NAN_REASONS = {"mase": "undefined: the seasonal-naive forecast has zero error on the training split (a perfectly "
                       "periodic series), and MASE divides by that error"}


def nan_reason(path: str) -> str | None:
    """Why a metric is NaN, where its definition here says so.

    Args:
        path: the metric's dotted path in a result (``metrics.mase``, ``baseline.ridge.temp_air/mase``).

    Returns:
        The reason for the metric its last key names (after any ``target/``), or None.
    """
    return NAN_REASONS.get(path.rpartition(".")[2].rpartition("/")[2])


def seasonal_naive(series: np.ndarray, origins: np.ndarray, horizon: int, period: int) -> np.ndarray:
    """Forecasts each step as the value one (or more) whole seasons before it.

    For origin t (the last observed index) and step h = 1..horizon the forecast is
    ``series[t + h - period * ceil(h / period)]``, so only observed values are used.

    Args:
        series: values, shape [T] or [T, C].
        origins: indices of the last observed step of each window, shape [N].
        horizon: steps ahead.
        period: the season length in steps (48 for "same time yesterday" at 30 min).

    Returns:
        Forecasts of shape [N, horizon] (+ [C] if ``series`` has columns).
    """
    steps = np.arange(1, horizon + 1)
    lags = period * np.ceil(steps / period).astype(int) - steps
    if len(origins) and origins.min() < lags.max():
        raise ValueError(f"seasonal naive with period {period} needs {lags.max() - origins.min()} more steps "
                         "of history")
    return lagged_values(series, origins, lags)


def lagged_values(series: np.ndarray, origins: np.ndarray, lags: np.ndarray,
                  out: np.ndarray | None = None) -> np.ndarray:
    """``series[origins[:, None] - lags]``, gathered CHUNK values at a time: an index array of the whole
    [N, steps] would be as large as the result (a long series' test split holds millions of values).

    Args:
        series: values, shape [T] or [T, C].
        origins: shape [N]; lags: shape [steps] (an index below 0 counts from the end, as NumPy's).
        out: the array to write into, shape [N, steps] (+ [C]); None: a new one of ``series``' dtype.

    Returns:
        ``out``, filled.
    """
    if out is None:
        out = np.empty((len(origins), len(lags), *series.shape[1:]), series.dtype)
    rows = max(1, CHUNK // len(lags))
    for first in range(0, len(origins), rows):
        out[first: first + rows] = series[origins[first: first + rows, None] - lags]
    return out


def mase_scale(train_series: np.ndarray, period: int) -> np.ndarray:
    """Mean absolute error of the in-sample seasonal-naive forecast: the MASE denominator.

    Args:
        train_series: training values, shape [T] or [T, C].
        period: the season length in steps (1 for the plain naive forecast).

    Returns:
        One scale per column (a scalar for a 1-D series).
    """
    return np.mean(np.abs(train_series[period:] - train_series[:-period]), axis=0)


def forecast_metrics(y_true: np.ndarray, y_pred: np.ndarray, scale: float) -> dict[str, float]:
    """MAE, RMSE, sMAPE (percent, 0-200) and MASE of one target.

    Args:
        y_true, y_pred: arrays of the same shape ([N, horizon]), in the user's units.
        scale: the MASE denominator from ``mase_scale``.

    Returns:
        ``{"mae", "rmse", "smape", "mase"}`` as floats.
    """
    # Summed in float64 over chunks of the values, a few work arrays of CHUNK values each: the test
    # split of a long series holds millions of values, and sklearn's MAE/RMSE would copy both inputs.
    truth, forecast = y_true.reshape(-1), y_pred.reshape(-1)
    absolute = squared = relative = 0.0
    for first in range(0, len(truth), CHUNK):
        part = slice(first, first + CHUNK)
        error = np.subtract(truth[part], forecast[part], dtype=np.float64)
        np.abs(error, out=error)
        scale_sum = np.abs(truth[part], dtype=np.float64)
        scale_sum += np.abs(forecast[part])
        absolute += float(error.sum())
        relative += float(np.divide(error, scale_sum, out=scale_sum, where=scale_sum > 0).sum())  # 0 where both are 0
        squared += float(np.square(error, out=error).sum())
    mae = absolute / len(truth)
    return {"mae": mae, "rmse": math.sqrt(squared / len(truth)), "smape": 200 * relative / len(truth),
            "mase": mae / float(scale) if scale > 0 else float("nan")}


def mae_by_lead(y_true: np.ndarray, y_pred: np.ndarray) -> np.ndarray:
    """The MAE of each lead time (forecast step) of one target: how the error grows with the horizon.

    Args:
        y_true, y_pred: arrays of the same shape [N, horizon], in the user's units.

    Returns:
        [horizon] float64: the mean over the N forecasts of the absolute error at each step; their
        mean is ``forecast_metrics``' MAE.
    """
    rows = max(1, CHUNK // y_true.shape[1])  # summed over chunks of rows, as forecast_metrics sums its values
    total = np.zeros(y_true.shape[1])
    for first in range(0, len(y_true), rows):
        error = np.subtract(y_true[first: first + rows], y_pred[first: first + rows], dtype=np.float64)
        total += np.abs(error, out=error).sum(axis=0)
    return total / len(y_true)


# --- Translation: BLEU and chrF (sacrebleu) -------------------------------------------------------------------------


def _reference_streams(references: Sequence[str | Sequence[str]], num_hypotheses: int) -> list[list[str | None]]:
    """Per-hypothesis references -> sacrebleu's reference streams (one list per reference slot, None = missing)."""
    if len(references) != num_hypotheses:
        raise ValueError(f"{len(references)} references for {num_hypotheses} hypotheses: expected one entry each")
    rows = [[row] if isinstance(row, str) else list(row) for row in references]
    for index, row in enumerate(rows):
        if not row:
            raise ValueError(f"hypothesis {index} has no reference")
    slots = max(len(row) for row in rows)
    return [[row[slot] if slot < len(row) else None for row in rows] for slot in range(slots)]


def _corpus_score(metric: Any, references: Sequence[str | Sequence[str]],
                  hypotheses: Sequence[str]) -> dict[str, Any]:
    streams = _reference_streams(references, len(hypotheses))
    result = metric.corpus_score(list(hypotheses), streams)
    return {"score": float(result.score), "signature": str(metric.get_signature())}


def bleu(references: Sequence[str | Sequence[str]], hypotheses: Sequence[str], **options: Any) -> dict[str, Any]:
    """Corpus BLEU (0-100) with sacrebleu's defaults (13a tokenisation, exponential smoothing).

    The hypotheses may be word-tokenised (``"dijo : ven ."``, as the translation pipeline writes them): 13a splits
    the references' punctuation the same way, so the score is that of the detokenised text. sacrebleu's warning
    about tokenised periods is therefore off (``force=True``, which leaves the signature unchanged).

    Args:
        references: one entry per hypothesis: a reference string, or a list of one or
            more references (the number may vary between hypotheses).
        hypotheses: the system's outputs.
        **options: passed to ``sacrebleu.metrics.BLEU`` (e.g. ``tokenize="intl"``, ``lowercase=True``).

    Returns:
        ``{"score": float, "signature": str}``; report the signature beside the score
        (e.g. ``nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0``).
    """
    from sacrebleu.metrics import BLEU

    return _corpus_score(BLEU(**{"force": True, **options}), references, hypotheses)


def chrf(references: Sequence[str | Sequence[str]], hypotheses: Sequence[str], **options: Any) -> dict[str, Any]:
    """Corpus chrF (0-100; chrF2: character 6-grams, beta 2); ``word_order=2`` gives chrF++.

    Args:
        references: as for ``bleu``.
        hypotheses: the system's outputs.
        **options: passed to ``sacrebleu.metrics.CHRF``.

    Returns:
        ``{"score": float, "signature": str}``.
    """
    from sacrebleu.metrics import CHRF

    return _corpus_score(CHRF(**options), references, hypotheses)


# --- Speech recognition: WER and CER (jiwer) ------------------------------------------------------------------------


def _check_transcripts(references: Sequence[str], hypotheses: Sequence[str]) -> tuple[list[str], list[str]]:
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references for {len(hypotheses)} hypotheses: expected one each")
    for index, reference in enumerate(references):
        if not reference.strip():
            raise ValueError(f"reference {index} is empty: an error rate needs at least one reference word")
    return list(references), list(hypotheses)


def word_error_rate(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Corpus WER: (substitutions + deletions + insertions) / reference words, over all utterances.

    Words are split on whitespace; normalise case and punctuation before calling.

    Args:
        references: the true transcripts (none empty).
        hypotheses: the recognised transcripts, one per reference.

    Returns:
        The WER as a fraction (it can exceed 1 with many insertions).
    """
    import jiwer

    return float(jiwer.wer(*_check_transcripts(references, hypotheses)))


def character_error_rate(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Corpus CER: character edit distance / reference characters (spaces count as characters).

    Args:
        references: the true transcripts (none empty).
        hypotheses: the recognised transcripts, one per reference.

    Returns:
        The CER as a fraction.
    """
    import jiwer

    return float(jiwer.cer(*_check_transcripts(references, hypotheses)))


# --- Tagging: ROC-AUC and PR-AUC (scikit-learn) ---------------------------------------------------------------------


def _label_columns(y_true: np.ndarray, y_score: np.ndarray,
                   labels: Sequence[str] | None) -> tuple[np.ndarray, np.ndarray, dict[str, int], dict[str, str]]:
    """Checks labels and scores of the same shape [n, labels] (or [n]).

    Returns:
        ``(truth, scores, columns, skipped)``: the arrays as [n, labels], the column of each label
        that has both classes, and why each other label has none.
    """
    truth = np.asarray(y_true)
    scores = np.asarray(y_score, dtype=np.float64)
    if truth.ndim == 1:
        truth, scores = truth[:, None], scores[:, None]
    if truth.shape != scores.shape or truth.ndim != 2:
        raise ValueError(f"y_true {truth.shape} and y_score {scores.shape}: expected the same shape [n, labels]")
    if not np.isin(truth, (0, 1)).all():
        raise ValueError("y_true must hold 0/1 labels")
    if not np.isfinite(scores).all():
        raise ValueError("y_score holds NaN or Inf")
    names = [str(i) for i in range(truth.shape[1])] if labels is None else [str(name) for name in labels]
    if len(names) != truth.shape[1]:
        raise ValueError(f"{len(names)} label names for {truth.shape[1]} label columns")
    columns, skipped = {}, {}
    for column, name in enumerate(names):
        positives = int(truth[:, column].sum())
        if positives in (0, len(truth)):
            skipped[name] = f"only {'positive' if positives else 'negative'} examples ({len(truth)})"
        else:
            columns[name] = column
    return truth, scores, columns, skipped


def _label_averages(score: Callable[[np.ndarray, np.ndarray], float], y_true: np.ndarray, y_score: np.ndarray,
                    labels: Sequence[str] | None) -> dict[str, Any]:
    """Scores each label that has both classes, then the macro and micro averages."""
    truth, scores, columns, skipped = _label_columns(y_true, y_score, labels)
    per_label = {name: float(score(truth[:, column], scores[:, column])) for name, column in columns.items()}
    pooled = truth.reshape(-1)
    micro = float(score(pooled, scores.reshape(-1))) if 0 < pooled.sum() < pooled.size else None
    macro = float(np.mean(list(per_label.values()))) if per_label else None
    return {"macro": macro, "micro": micro, "per_label": per_label, "skipped": skipped}


def roc_auc(y_true: np.ndarray, y_score: np.ndarray, labels: Sequence[str] | None = None) -> dict[str, Any]:
    """ROC-AUC per label, macro (mean over the scorable labels) and micro (all label decisions pooled).

    A label whose examples are all positive or all negative has no ROC curve: it is left
    out of ``per_label`` and the macro mean and listed in ``skipped`` with the reason. The
    micro average pools every label column, skipped ones included (their entries are still
    valid positives or negatives); it is None only if the pool itself has one class.

    Args:
        y_true: 0/1 labels, [n, labels] (or [n] for one label).
        y_score: scores or probabilities of the same shape (higher = more likely positive).
        labels: label names for ``per_label`` and ``skipped`` (default "0", "1", ...).

    Returns:
        ``{"macro": float | None, "micro": float | None, "per_label": {name: float},
        "skipped": {name: reason}}``.
    """
    from sklearn.metrics import roc_auc_score

    return _label_averages(roc_auc_score, y_true, y_score, labels)


def roc_curves(y_true: np.ndarray, y_score: np.ndarray,
               labels: Sequence[str] | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The ROC curve of each label with both classes (scikit-learn's ``roc_curve``), the curves ``roc_auc`` measures.

    Args:
        y_true, y_score, labels: as for ``roc_auc`` (single-class labels are left out, as there).

    Returns:
        ``{name: (false_positive_rate, true_positive_rate)}``, each curve from (0, 0) to (1, 1);
        its trapezoid area is the label's ``roc_auc`` ``per_label`` value.
    """
    from sklearn.metrics import roc_curve

    truth, scores, columns, _ = _label_columns(y_true, y_score, labels)
    return {name: roc_curve(truth[:, column], scores[:, column])[:2] for name, column in columns.items()}


def pr_auc(y_true: np.ndarray, y_score: np.ndarray, labels: Sequence[str] | None = None) -> dict[str, Any]:
    """PR-AUC as average precision (scikit-learn's step-wise sum, no interpolation), per label and averaged.

    Single-class labels are skipped as in ``roc_auc`` (with no positives precision is
    undefined; with only positives it is 1 whatever the scores).

    Args:
        y_true, y_score, labels: as for ``roc_auc``.

    Returns:
        The same dictionary as ``roc_auc``.
    """
    from sklearn.metrics import average_precision_score

    return _label_averages(average_precision_score, y_true, y_score, labels)


# --- Language modelling: perplexity, bits per character, the unigram baseline ---------------------------------------


def _mean_negative_log_prob(log_probs: Any, mask: Any = None) -> float:
    values = np.asarray(log_probs, dtype=np.float64)
    weights = np.ones_like(values) if mask is None else np.asarray(mask, dtype=np.float64)
    if values.shape != weights.shape:
        raise ValueError(f"log_probs {values.shape} and mask {weights.shape}: expected the same shape")
    if weights.sum() <= 0:
        raise ValueError("no tokens to score (empty input or an all-zero mask)")
    return float(-np.sum(values * weights) / np.sum(weights))


def perplexity(log_probs: Any, mask: Any = None) -> float:
    """Perplexity ``exp(-mean(log p))`` over the (masked) tokens.

    Args:
        log_probs: per-token natural-log probabilities, any shape (NumPy or an eager tensor).
        mask: optional weights of the same shape (1 for real tokens, 0 for padding).

    Returns:
        The perplexity as a Python float.
    """
    return math.exp(_mean_negative_log_prob(log_probs, mask))


def bits_per_char(log_probs: Any, mask: Any = None) -> float:
    """Bits per character ``-mean(log2 p)`` of per-character natural-log probabilities.

    Args:
        log_probs: per-character natural-log probabilities, any shape.
        mask: optional weights of the same shape (1 for real characters).

    Returns:
        The mean cost in bits per character.
    """
    return _mean_negative_log_prob(log_probs, mask) / math.log(2)


def label_log_probs(logits: Any, labels: Any) -> np.ndarray:
    """Natural-log probabilities of ``labels`` under the softmax of ``logits`` (scipy's ``log_softmax``).

    Args:
        logits: ``[..., classes]`` scores (a model's outputs), any float dtype.
        labels: int class ids, the shape of ``logits`` without its last axis.

    Returns:
        float64 log-probabilities of the shape of ``labels``: the input of ``perplexity`` and ``bits_per_char``.
    """
    from scipy.special import log_softmax

    log_probs = log_softmax(np.asarray(logits, dtype=np.float64), axis=-1)
    return np.take_along_axis(log_probs, np.asarray(labels, dtype=np.int64)[..., None], axis=-1)[..., 0]


def unigram_log_probs(train_counts: Any, targets: Any, smoothing: float = 1.0) -> np.ndarray:
    """Natural-log probabilities of ``targets`` under the add-``smoothing`` unigram model of the
    training counts: the baseline of every language model.

    Args:
        train_counts: ``[V]`` token counts of the training data (id 0: unknown tokens).
        targets: int ids of the scored tokens, any shape.
        smoothing: added to every count (> 0), so unseen ids have a finite cost.

    Returns:
        float64 log-probabilities of the shape of ``targets``.
    """
    counts = np.asarray(train_counts, dtype=np.float64) + smoothing
    if counts.ndim != 1 or np.any(counts <= 0):
        raise ValueError("train_counts must be 1-D and non-negative, with smoothing > 0")
    return np.log(counts / counts.sum())[np.asarray(targets, dtype=np.int64)]


# --- Tagging decisions: F1-optimal thresholds, precision and recall at them, tag groups (scikit-learn) --------------


def f1_thresholds(y_true: np.ndarray, y_score: np.ndarray) -> np.ndarray:
    """The F1-optimal decision threshold of each tag (0.5 for a tag without positives).

    Each tag's threshold is the score, among its clips' scores, at which deciding ``score >=
    threshold`` gives the highest F1 (the lowest such score on ties, as ``precision_recall_curve``
    orders them).

    Args:
        y_true: 0/1 [clips, tags].
        y_score: scores of the same shape.

    Returns:
        float32 [tags]: predict a tag when its score is >= its threshold.
    """
    from sklearn.metrics import precision_recall_curve

    thresholds = np.full(y_true.shape[1], 0.5, np.float32)
    for tag in range(y_true.shape[1]):
        if y_true[:, tag].any():
            precision, recall, cuts = precision_recall_curve(y_true[:, tag], y_score[:, tag])
            f1 = 2 * precision[:-1] * recall[:-1] / np.maximum(precision[:-1] + recall[:-1], 1e-12)
            thresholds[tag] = cuts[int(np.argmax(f1))]
    return thresholds


def precision_recall_at(y_true: np.ndarray, y_score: np.ndarray, thresholds: np.ndarray) -> dict[str, float]:
    """Micro and macro precision and recall of the decisions ``y_score >= thresholds``.

    A tag with no decided (or no true) clip counts as precision (or recall) 0 in the macro mean.

    Args:
        y_true: 0/1 [clips, tags].
        y_score: scores of the same shape.
        thresholds: [tags], one per tag (``f1_thresholds``).

    Returns:
        ``{"precision_micro", "recall_micro", "precision_macro", "recall_macro"}`` as floats.
    """
    from sklearn.metrics import precision_score, recall_score

    decided = (y_score >= thresholds[None, :]).astype(int)
    return {f"{kind}_{average}": float(score(y_true, decided, average=average, zero_division=0))
            for average in ("micro", "macro") for kind, score in (("precision", precision_score),
                                                                  ("recall", recall_score))}


def tag_groups(tags: Iterable[str]) -> dict[str, list[str]]:
    """The tags of each tag group, the part of a ``group:value`` name before the colon.

    Args:
        tags: tag names.

    Returns:
        group -> its tags (in the given order), by group name; tags without a colon (plain tags)
        form no group, so with only plain tags it is empty.
    """
    groups: dict[str, list[str]] = {}
    for tag in tags:
        if ":" in tag:
            groups.setdefault(tag.partition(":")[0], []).append(tag)
    return dict(sorted(groups.items()))


def group_means(per_tag: dict[str, float]) -> dict[str, float]:
    """Mean of the per-tag values of each tag group (``tag_groups``).

    Args:
        per_tag: tag name -> value (a per-tag ROC-AUC, say).

    Returns:
        group -> mean of its tags' values, by group name; empty with only plain tags.
    """
    return {group: float(np.mean([per_tag[tag] for tag in tags])) for group, tags in tag_groups(per_tag).items()}


def tagging_report(y_true: np.ndarray, y_score: np.ndarray, tags: Sequence[str]) -> dict[str, Any]:
    """The ranking metrics of a tagger: ROC-AUC and PR-AUC (``roc_auc``, ``pr_auc``) and per-group ROC-AUC.

    Args:
        y_true: 0/1 [clips, tags].
        y_score: scores of the same shape.
        tags: the tag names, in column order.

    Returns:
        ``{"roc_auc_macro", "roc_auc_micro", "pr_auc_macro", "pr_auc_micro", "roc_auc_per_tag",
        "roc_auc_per_group" (``group_means``), "skipped_tags" (single-class tags and why)}``.
    """
    roc, pr = roc_auc(y_true, y_score, tags), pr_auc(y_true, y_score, tags)
    return {"roc_auc_macro": roc["macro"], "roc_auc_micro": roc["micro"], "pr_auc_macro": pr["macro"],
            "pr_auc_micro": pr["micro"], "roc_auc_per_tag": roc["per_label"],
            "roc_auc_per_group": group_means(roc["per_label"]), "skipped_tags": roc["skipped"]}
