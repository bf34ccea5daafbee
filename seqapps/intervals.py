"""What is calibrated on held-out forecasts: prediction intervals (split conformal) and their scores, and the
shrinkage of a correction to a base forecast.

Forecast errors are larger in volatile weeks (winter weather, holidays) than in calm
ones, so the intervals are locally weighted: the calibration residuals are divided
by a scale read from each input window (``local_scale``), and the served interval
is the forecast plus the calibrated offsets times the window's own scale.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

CHUNK_ROWS = 8192  # rows per work array of the pinball loss: a long test split holds millions of values
#: the shrinkage weights tried, from the base forecast alone (0) to the whole correction (1).
SHRINKAGE_GRID = np.linspace(0.0, 1.0, 21)


def interval_levels(coverage: float) -> tuple[float, float]:
    """The lower and upper quantile levels of a central interval.

    Args:
        coverage: the interval's coverage in (0, 1).

    Returns:
        ``(lower, upper)``, rounded to 6 digits: 0.8 gives (0.1, 0.9).
    """
    return round((1 - coverage) / 2, 6), round((1 + coverage) / 2, 6)


def conformal_offsets(residuals: np.ndarray, quantiles: tuple[float, ...]) -> np.ndarray:
    """Per-step residual quantiles on a calibration split: forecast + offset is that quantile.

    Each forecast step (and target) gets its own offsets, since errors grow with the
    horizon. With n calibration windows, quantile q is the ceil((n + 1) q)-th smallest
    residual (the split-conformal rank) for q above one half, and the mirror rank below.

    Args:
        residuals: calibration truth minus forecast, shape [N, ...]; sorted in place (along the first axis),
            so that a large calibration set is not copied.
        quantiles: levels in (0, 1).

    Returns:
        Offsets of shape [len(quantiles), ...].
    """
    residuals.sort(axis=0)
    n = len(residuals)
    ranks = [min(n, int(np.ceil((n + 1) * q))) - 1 if q >= 0.5 else max(0, int(np.floor((n + 1) * q)) - 1)
             for q in quantiles]
    return residuals[ranks]


def scaled_conformal_offsets(batches: Iterable[tuple[slice, np.ndarray, np.ndarray, np.ndarray]],
                             shape: tuple[int, ...], quantiles: tuple[float, ...],
                             dtype: Any = "float32") -> np.ndarray:
    """``conformal_offsets`` of locally weighted residuals, ``(truth - forecast) / scale``, gathered batch by batch.

    The residuals are written into one array as the batches come, so a long calibration split
    is held once, in ``dtype``.

    Args:
        batches: ``(rows, forecast, scale, truth)``: the rows of the calibration set a batch fills, its
            forecasts and true values [batch, ...] and the scale of each row (broadcast against them).
        shape: the calibration set's residuals' shape, [N, ...]; every row must be filled.
        quantiles: levels in (0, 1).
        dtype: the residuals' dtype.

    Returns:
        Offsets of shape [len(quantiles), ...]: the served interval is forecast + offset * scale.
    """
    residuals = np.empty(shape, dtype)
    for rows, forecast, scale, truth in batches:
        np.subtract(truth / scale, forecast / scale, out=residuals[rows], dtype=residuals.dtype)
    return conformal_offsets(residuals, quantiles)


def local_scale(window: Any, lag: int, floor: float) -> Any:
    """The mean absolute change over ``lag`` steps within each window, plus a floor.

    Works on NumPy arrays and on tensors inside a served graph (Keras ops).

    Args:
        window: values of one column, shape [batch, lookback] with lookback > lag.
        lag: the change is ``x[t] - x[t - lag]`` (a day, for hourly weather).
        floor: added so that a constant window does not give a zero-width interval.

    Returns:
        Shape [batch].
    """
    from keras import ops

    window = ops.convert_to_tensor(window, "float32")
    return ops.mean(ops.abs(window[:, lag:] - window[:, :-lag]), axis=1) + floor


def local_scales(windows: Sequence[Any], lag: int, floors: Sequence[float]) -> Any:
    """``local_scale`` of several columns' windows, stacked to broadcast over a forecast's horizon.

    Args:
        windows: one window per column, each [batch, lookback] (NumPy or tensors).
        lag, floors: as in ``local_scale``, one floor per column.

    Returns:
        Shape [batch, 1, columns].
    """
    from keras import ops

    return ops.stack([local_scale(window, lag, floor) for window, floor in zip(windows, floors)], axis=-1)[:, None, :]


def shrinkage_weights(truth: np.ndarray, base: np.ndarray, correction: np.ndarray, per_step: bool) -> np.ndarray:
    """The weight w in ``SHRINKAGE_GRID`` of the correction that minimises the MAE of ``base + w * correction``.

    Args:
        truth, base, correction: shape [windows, horizon, targets], in user units; forecasts of
            windows the correction did not train on.
        per_step: one weight per horizon step and target; else one per target.

    Returns:
        Weights of shape [horizon, targets] (the smallest of tied weights).
    """
    errors = _errors_by_weight(truth, base, correction)
    if not per_step:  # [weights, horizon, targets]: one weight per target, the same at every step
        errors = np.broadcast_to(errors.mean(axis=1, keepdims=True), errors.shape)
    return SHRINKAGE_GRID[np.argmin(errors, axis=0)]


def window_scale(interval: dict[str, Any], targets: Sequence[str], inputs: dict[str, Any]) -> Any:
    """Each window's local scale per target, [batch, 1, targets], as ``interval`` (a saved state's) sets it.

    Args:
        interval: ``{"scale_lag", "scale_floor", ...}``: the local scale's lag and floor per target.
        targets: the target columns, in order.
        inputs: a batch of window inputs, ``{column: [batch, lookback]}``.
    """
    return local_scales([inputs[name] for name in targets], interval["scale_lag"], interval["scale_floor"])


def shrinkage_parts(model: Any, windows: Iterable[tuple[Any, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A forecaster's base and correction on some windows, apart: its ``Shrinkage`` layer "shrinkage" at 0 and 1.

    Args:
        model: a Keras forecaster of [batch, members, horizon, targets]; its shrinkage weights are left at 1.
        windows: batches of ``(inputs, targets [B, horizon, targets])``.

    Returns:
        ``(truth, base, correction)``, float64 [windows, horizon, targets]: the members' mean forecast is
        ``base + correction`` with weights of 1.
    """
    from seqapps import compat

    layer, predict = model.get_layer("shrinkage"), compat.batch_predictor(model)
    ones = np.ones(layer.weight.shape, "float32")
    whole, base, truth = [], [], []
    for inputs, targets in windows:
        for weights, found in ((ones, whole), (0 * ones, base)):
            layer.set_weights([weights])
            found.append(predict(inputs).numpy().mean(axis=1))  # over the members axis
        truth.append(np.asarray(targets))
    layer.set_weights([ones])
    whole, base, truth = (np.concatenate(found).astype("float64") for found in (whole, base, truth))
    return truth, base, whole - base


def shrinkage_choice(truth: np.ndarray, base: np.ndarray, correction: np.ndarray,
                     per_step: bool) -> tuple[np.ndarray, dict[str, float]]:
    """``shrinkage_weights`` and the MAE of the base, of the whole correction and of the shrunk one.

    Returns:
        The weights [horizon, targets] and ``{"base", "correction", "shrunk"}``.
    """
    weights = shrinkage_weights(truth, base, correction, per_step)
    return weights, shrinkage_scores(truth, base, correction, weights)


def shrinkage_scores(truth: np.ndarray, base: np.ndarray, correction: np.ndarray,
                     weights: np.ndarray) -> dict[str, float]:
    """The MAE of the base, of the base plus the whole correction and of the base plus the shrunk one.

    Args:
        truth, base, correction: as in ``shrinkage_weights``.
        weights: [horizon, targets] weights of the correction.

    Returns:
        ``{"base", "correction", "shrunk"}``.
    """
    return {"base": float(np.abs(truth - base).mean()),
            "correction": float(np.abs(truth - base - correction).mean()),
            "shrunk": float(np.abs(truth - base - weights * correction).mean())}


def choose_shrinkage(model: Any, windows: Iterable[tuple[Any, Any]], base_shift: np.ndarray | None,
                     per_step: bool) -> tuple[np.ndarray, dict[str, float]]:
    """The shrinkage weights chosen on the validation windows, and the validation MAE with each choice.

    The base forecast is the model's with the weights of its ``Shrinkage`` layer "shrinkage" at zero,
    plus ``base_shift``, so that both the base and the correction are out of sample.

    Args:
        model: as in ``shrinkage_parts``.
        windows: batches of ``(inputs, targets [B, horizon, targets])`` of the validation windows.
        base_shift: what to add to the base forecast [windows, horizon, targets] (the ridge fitted
            on the training split alone minus the full one), or None.
        per_step: as in ``shrinkage_weights``.

    Returns:
        As ``shrinkage_choice``, on the validation windows.
    """
    truth, base, correction = shrinkage_parts(model, windows)
    if base_shift is not None:
        base = base + base_shift
    return shrinkage_choice(truth, base, correction, per_step)


def rolling_origin_rows(edges: np.ndarray, origins: int, gap: int) -> list[tuple[range, range, range]]:
    """The rows of a rolling-origin validation over contiguous blocks of time-ordered forecast windows.

    Each of the last ``origins`` blocks is held out in turn; the correction it is scored on trains on
    the rows before it, the block just before it (less a gap) pacing that training. A gap of
    ``gap`` rows keeps the targets of the rows trained on from overlapping the next part's.

    Args:
        edges: the blocks' row edges, [blocks + 1] (``seqapps.baselines.RidgeFit.edges``).
        origins: how many of the last blocks are held out, at most blocks - 2.
        gap: the rows left out before each held-out block and each pacing block (the horizon).

    Returns:
        ``(training rows, pacing rows, held-out rows)`` per origin, in time order; [] when a part would be empty.
    """
    blocks = len(edges) - 1
    found = []
    for block in range(max(2, blocks - origins), blocks):
        train, pace, held = (range(0, edges[block - 1] - gap), range(edges[block - 1], edges[block] - gap),
                             range(edges[block], edges[block + 1]))
        if not (len(train) and len(pace) and len(held)):
            return []
        found.append((train, pace, held))
    return found


def rolling_shrinkage(rows: Sequence[tuple[range, range, range]],
                      parts: Any) -> tuple[np.ndarray, dict[str, float]]:
    """Per-step shrinkage weights chosen on the out-of-sample forecasts of several origins.

    At each lead and target, w minimises the MAE of every origin's held-out rows together, among the
    weights that lose to w = 0 (the base alone) on no single origin. A correction that wins on the
    pooled rows while losing on one block is not kept: with one weight per lead, the pooled choice alone
    keeps a little correction at some leads by luck.

    Args:
        rows: ``rolling_origin_rows``'.
        parts: ``parts(train, pace, held) -> (truth, base, correction)`` of the held-out rows, each
            [rows, horizon, targets], from a correction trained on ``train`` (paced by ``pace``) and a base
            that has not seen ``held``.

    Returns:
        As ``shrinkage_choice`` with ``per_step``, the scores on every origin's held-out rows together.
    """
    found = [parts(*origin) for origin in rows]
    per_origin = np.stack([_errors_by_weight(*part) for part in found])  # [origins, weights, horizon, targets]
    never_worse = np.all(per_origin <= per_origin[:, :1], axis=0)  # SHRINKAGE_GRID[0] is w = 0
    truth, base, correction = (np.concatenate([part[i] for part in found]) for i in range(3))
    pooled = np.where(never_worse, _errors_by_weight(truth, base, correction), np.inf)
    weights = SHRINKAGE_GRID[np.argmin(pooled, axis=0)]
    return weights, shrinkage_scores(truth, base, correction, weights)


def _errors_by_weight(truth: np.ndarray, base: np.ndarray, correction: np.ndarray) -> np.ndarray:
    """The MAE of ``base + w * correction`` per weight of ``SHRINKAGE_GRID``, lead and target."""
    return np.stack([np.abs(truth - base - w * correction).mean(axis=0) for w in SHRINKAGE_GRID])


def describe_shrinkage(weights: np.ndarray, targets: Sequence[str]) -> str:
    """Which leads of the forecast the correction changed, in words.

    Args:
        weights: [horizon, targets] shrinkage weights (1: the correction kept, 0: dropped).
        targets: the target columns.

    Returns:
        E.g. "correction kept at leads 1-8, shrunk at 9-17 (w 0.1-0.95), dropped at 18-24", a clause per
        target after its name when there are several.
    """
    clauses = []
    for column, name in enumerate(targets):
        w = np.asarray(weights)[:, column]
        kinds = np.where(w >= 1, "kept", np.where(w <= 0, "dropped", "shrunk"))
        runs, start = [], 0
        for lead in range(1, len(w) + 1):
            if lead == len(w) or kinds[lead] != kinds[start]:
                leads = f"{start + 1}-{lead}" if lead - start > 1 else f"{lead}"
                span = w[start:lead]
                detail = (f" (w {span.min():.3g}-{span.max():.3g})" if span.min() < span.max()
                          else f" (w {span[0]:.3g})") if kinds[start] == "shrunk" else ""
                runs.append(f"{kinds[start]} at lead{'s' if lead - start > 1 else ''} {leads}{detail}")
                start = lead
        clauses.append((f"{name}: " if len(targets) > 1 else "") + "correction " + ", ".join(runs))
    return "; ".join(clauses)


def pinball_loss(truth: np.ndarray, quantile_forecasts: Sequence[np.ndarray], quantiles: tuple[float, ...]) -> float:
    """The mean pinball (quantile) loss over quantile levels and values.

    Args:
        truth: shape [N, ...].
        quantile_forecasts: one forecast per level, each shaped like ``truth`` (or an array [levels, N, ...]).
        quantiles: levels in (0, 1).

    Returns:
        The mean over levels of mean(max(q (y - f), (q - 1) (y - f))); at q = 0.5 it is half the MAE.
    """
    losses = []
    truth = truth.reshape(len(truth), -1)
    for forecast, level in zip(quantile_forecasts, quantiles):  # one level at a time, in chunks of rows
        forecast, total = forecast.reshape(truth.shape), 0.0
        for first in range(0, len(truth), CHUNK_ROWS):
            error = np.subtract(truth[first: first + CHUNK_ROWS], forecast[first: first + CHUNK_ROWS],
                                dtype=np.float64)
            below = error * (level - 1)
            error *= level
            total += float(np.maximum(error, below, out=error).sum())
        losses.append(total / truth.size)
    return float(np.mean(losses))


def coverage(truth: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> float:
    """The fraction of values inside [lower, upper]."""
    return float(np.mean((truth >= lower) & (truth <= upper)))
