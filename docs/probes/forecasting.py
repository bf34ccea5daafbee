"""The forecasting probes behind docs/results.md: what else could beat the ridge, measured outside the pipeline.

Each probe rebuilds the pipelines' ridge baseline in NumPy on the same backtest folds
(``seqapps.data.tables.fold_bounds``, 3 folds: the last is the default split) and tries one
idea beside it. These are prototypes for deciding what to build, not library code: the
pipeline's ridge (``seqapps.baselines.fit_ridge``) is the tested one. This one solves with the same
``baselines.Moments`` and the same ``CalendarFeatures``, in float64 from the raw values; it gives the
pipeline's weather ridge per fold to 0.001 degC and its load ridge to within 2 MW.

Usage::

    python docs/probes/forecasting.py load       # ridge variants, Holt-Winters, MLP, boosting
    python docs/probes/forecasting.py weather    # boosting per step, a month of lookback
    python docs/probes/forecasting.py coverage   # 80% coverage: in-sample against out-of-fold residuals
    python docs/probes/forecasting.py pipeline [--pipelines load_forecasting] [--set key=value ...]
                                                 # the pipeline's own correction per step (trains models)
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from seqapps import baselines, intervals
from seqapps.data import datasets
from seqapps.data.tables import fold_bounds

ALPHAS = np.logspace(-4, 3, 15)
FOLDS = 3


@dataclasses.dataclass
class Series:
    """One pipeline's default data and window sizes, in steps."""

    values: np.ndarray  # [rows, columns], the target first
    seconds: np.ndarray  # Unix seconds of each row
    lookback: int
    horizon: int
    lags: int
    weekly_residual: bool  # forecast the change on the value a week earlier (load)
    scale_lag: int  # the interval's local scale: the mean absolute change over this lag


def load_series(lookback: int = 384) -> Series:
    frame = datasets.taylor_load()
    seconds = pd.to_datetime(frame["timestamp"]).to_numpy().astype("datetime64[s]").astype("int64")
    return Series(frame[["demand"]].to_numpy("float64"), seconds, lookback, 48, 48, True, 48)


def weather_series(lookback: int = 72) -> Series:
    frame = datasets.tmy3_weather()
    columns = [c for c in frame.columns if c != "timestamp"]
    seconds = pd.to_datetime(frame["timestamp"]).to_numpy().astype("datetime64[s]").astype("int64")
    return Series(frame[columns].to_numpy("float64"), seconds, lookback, 24, 72, False, 24)


def calendar(seconds: np.ndarray) -> np.ndarray:
    """The ridge's calendar features of each origin, [N, 4]: the pipeline's ``CalendarFeatures``."""
    from seqapps.layers.time_features import CalendarFeatures

    step = int(seconds[1] - seconds[0])
    past, _ = CalendarFeatures(step, 1, 1)(seconds.astype("int64"))
    return np.asarray(past, "float64")[:, 0]


@dataclasses.dataclass
class Windows:
    """The ridge's features and targets of one split, with what turns a forecast into user units."""

    origins: np.ndarray
    features: np.ndarray  # [N, F]
    targets: np.ndarray  # [N, horizon], scaled (and for load, the change on last week)
    base: np.ndarray  # [N, horizon], user units: what the scaled target is added to
    truth: np.ndarray  # [N, horizon], user units
    scale: np.ndarray  # [N]: the target's mean absolute change over scale_lag within the window

    def to_user(self, scaled: np.ndarray, std: float) -> np.ndarray:
        return scaled * std + self.base


@dataclasses.dataclass
class Fold:
    """One backtest fold: the series it sees, its target's training deviation and its splits."""

    values: np.ndarray
    scaled: np.ndarray  # every column by its training mean and deviation
    std: float
    splits: dict[str, Windows]


def folds(series: Series, extra: Callable[[np.ndarray, np.ndarray], list[np.ndarray]] | None = None) -> list[Fold]:
    """The backtest folds' windows; ``extra(scaled values, origins)`` adds feature columns."""
    found, calendar_of = [], calendar(series.seconds)
    for bounds in fold_bounds(len(series.values), 0.1, 0.2, FOLDS):
        n = bounds["test"][1]
        values = series.values[:n]
        train = values[: bounds["train"][1]]
        scaled = (values - train.mean(0)) / train.std(0)
        std = float(train[:, 0].std())
        week = 7 * 86400 // int(series.seconds[1] - series.seconds[0])
        if series.weekly_residual:
            change = np.full(n, np.nan)
            change[week:] = (values[week:, 0] - values[:-week, 0]) / std
            recent = change[:, None]
        else:
            recent = scaled
        splits = {}
        for name, (start, stop) in bounds.items():
            origins = np.arange(max(start - 1, series.lookback - 1), stop - series.horizon)
            lag_index = origins[:, None] + np.arange(1 - series.lags, 1)
            future = origins[:, None] + np.arange(1, series.horizon + 1)
            columns = [recent[lag_index].reshape(len(origins), -1), calendar_of[origins]]
            columns += extra(scaled, origins) if extra else []
            base = values[future - week, 0] if series.weekly_residual else np.full(future.shape, train[:, 0].mean())
            truth = values[future, 0]
            window = values[origins[:, None] + np.arange(1 - series.lookback, 1), 0]
            scale = np.asarray(intervals.local_scale(window, series.scale_lag, 1e-3 * std), "float64")
            splits[name] = Windows(origins, np.concatenate(columns, 1), (truth - base) / std, base, truth, scale)
        found.append(Fold(values, scaled, std, splits))
    return found


def fit(features: np.ndarray, targets: np.ndarray, alpha: float, weights: np.ndarray | None = None):
    """Ridge with an unpenalised intercept (scikit-learn's ``Ridge``): the pipeline's solver
    (``baselines.Moments``), or with sample weights, which that solver does not take, solved here."""
    if weights is None:
        return baselines.Moments.of(features, targets).solve([alpha])[0].predict
    weights = weights / weights.mean()
    mean_x, mean_y = weights @ features / len(features), weights @ targets / len(features)
    centred = features - mean_x
    coef = np.linalg.solve((centred * weights[:, None]).T @ centred + alpha * np.eye(features.shape[1]),
                           (centred * weights[:, None]).T @ (targets - mean_y))
    return lambda x: x @ coef + (mean_y - mean_x @ coef)


def ridge(fold: Fold, decay: float | None = None):
    """The pipeline's protocol: alpha by validation MAE of the training fit, then a refit on train + val.

    Returns:
        ``(final fit, training-only fit, alpha)``.
    """
    train, val = fold.splits["train"], fold.splits["val"]

    def weights(n: int) -> np.ndarray | None:
        return None if decay is None else decay ** np.arange(n)[::-1]

    alpha = min(ALPHAS, key=lambda a: np.abs(fit(train.features, train.targets, a, weights(len(train.targets)))(
        val.features) - val.targets).mean())
    features = np.concatenate([train.features, val.features])
    targets = np.concatenate([train.targets, val.targets])
    return (fit(features, targets, alpha, weights(len(targets))),
            fit(train.features, train.targets, alpha, weights(len(train.targets))), alpha)


def out_of_fold(fold: Fold, alpha: float, blocks: int = 5) -> np.ndarray:
    """Scaled residuals of train + val windows, each from a fit without its block and a horizon either side."""
    features = np.concatenate([fold.splits[s].features for s in ("train", "val")])
    targets = np.concatenate([fold.splits[s].targets for s in ("train", "val")])
    gap = targets.shape[1]
    edges = np.linspace(0, len(targets), blocks + 1).round().astype(int)
    residuals = np.empty_like(targets)
    for start, stop in zip(edges[:-1], edges[1:]):
        kept = np.ones(len(targets), bool)
        kept[max(start - gap, 0): stop + gap] = False
        residuals[start:stop] = targets[start:stop] - fit(features[kept], targets[kept], alpha)(features[start:stop])
    return residuals


def mae(forecast: np.ndarray, truth: np.ndarray) -> float:
    return float(np.abs(forecast - truth).mean())


def show(label: str, values: list[float], digits: int = 1) -> None:
    print(f"{label:<58} {', '.join(f'{v:.{digits}f}' for v in values)}")


def probe_load() -> None:
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.neural_network import MLPRegressor

    series = load_series()
    rows = {key: [] for key in ("ridge", "ridge + Holt-Winters, averaged", "the same, weight chosen on validation",
                                "decay 0.999", "median shift (validation)", "median shift (out of fold)",
                                "MLP seed 0", "MLP seed 0, averaged with the ridge", "MLP seed 1",
                                "MLP seed 1, averaged with the ridge")}
    boosting = []
    for fold in folds(series):
        final, train_only, alpha = ridge(fold)
        test, val = fold.splits["test"], fold.splits["val"]
        forecast = test.to_user(final(test.features), fold.std)
        rows["ridge"].append(mae(forecast, test.truth))
        fit_end = int(val.origins[-1] + series.horizon + 1)
        holt = baselines.holt_winters(fold.values[:, 0], fit_end, test.origins, series.horizon, 336)
        holt_val = baselines.holt_winters(fold.values[:fit_end, 0], int(fold.splits["train"].origins[-1]
                                          + series.horizon + 1), val.origins, series.horizon, 336)
        val_forecast = val.to_user(train_only(val.features), fold.std)
        grid = np.linspace(0, 1, 21)
        weight = grid[np.argmin([mae((1 - w) * val_forecast + w * holt_val, val.truth) for w in grid])]
        rows["ridge + Holt-Winters, averaged"].append(mae((forecast + holt) / 2, test.truth))
        rows["the same, weight chosen on validation"].append(mae((1 - weight) * forecast + weight * holt, test.truth))
        decayed = ridge(fold, decay=0.999)[0]
        rows["decay 0.999"].append(mae(test.to_user(decayed(test.features), fold.std), test.truth))
        val_residual = (val.targets - train_only(val.features)) * fold.std
        oof = out_of_fold(fold, alpha) * fold.std
        rows["median shift (validation)"].append(mae(forecast + np.median(val_residual, 0), test.truth))
        rows["median shift (out of fold)"].append(mae(forecast + np.median(oof, 0), test.truth))
        features = np.concatenate([fold.splits[s].features for s in ("train", "val")])
        targets = np.concatenate([fold.splits[s].targets for s in ("train", "val")])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for seed in (0, 1):
                mlp = MLPRegressor(hidden_layer_sizes=(64,), alpha=1e-2, max_iter=300, early_stopping=True,
                                   random_state=seed).fit(features, targets)
                direct = test.to_user(mlp.predict(test.features), fold.std)
                rows[f"MLP seed {seed}"].append(mae(direct, test.truth))
                rows[f"MLP seed {seed}, averaged with the ridge"].append(mae((direct + forecast) / 2, test.truth))
        def summary(x: np.ndarray) -> np.ndarray:  # the last weekly change, its means over 3 h and a day, calendar
            return np.concatenate([x[:, 47:48], x[:, 42:48].mean(1, keepdims=True), x[:, :48].mean(1, keepdims=True),
                                   x[:, 48:52]], 1)

        steps = []
        for step in (0, 11, 23, 47):
            model = HistGradientBoostingRegressor(loss="absolute_error", max_iter=150, learning_rate=0.05,
                                                  max_leaf_nodes=7, min_samples_leaf=40, random_state=0)
            model.fit(summary(features), oof[:, step] / fold.std)
            error = test.truth[:, step] - forecast[:, step]
            corrected = error - model.predict(summary(test.features)) * fold.std
            steps.append((step + 1, np.abs(error).mean(), np.abs(corrected).mean()))
        boosting.append(steps)
    for label, values in rows.items():
        show(f"load {label}", values)
    shorter = [mae(f.splits["test"].to_user(ridge(f)[0](f.splits["test"].features), f.std), f.splits["test"].truth)
               for f in folds(load_series(lookback=720))]
    show("load ridge, origins from day 15 (lookback 15 days)", shorter)
    for k, steps in enumerate(boosting):
        print(f"load fold {k} boosting on out-of-fold residuals (step, ridge, corrected):",
              ", ".join(f"{s}: {a:.0f} -> {b:.0f}" for s, a, b in steps))


def probe_weather() -> None:
    from sklearn.ensemble import HistGradientBoostingRegressor

    series = weather_series()
    for k, fold in enumerate(folds(series)):
        final, train_only, _ = ridge(fold)
        train, test = fold.splits["train"], fold.splits["test"]
        forecast = test.to_user(final(test.features), fold.std)

        def summary(origins: np.ndarray, values: np.ndarray = fold.scaled) -> np.ndarray:
            return np.concatenate([values[origins], values[origins] - values[origins - 1],
                                   values[origins] - values[origins - 24], calendar(series.seconds[origins])], 1)

        residual = train.targets - train_only(train.features)
        steps = []
        for step in (0, 5, 11, 23):
            model = HistGradientBoostingRegressor(loss="absolute_error", max_iter=200, learning_rate=0.05,
                                                  max_leaf_nodes=15, random_state=0).fit(summary(train.origins),
                                                                                          residual[:, step])
            error = test.truth[:, step] - forecast[:, step]
            steps.append((step + 1, np.abs(error).mean(),
                          np.abs(error - model.predict(summary(test.origins)) * fold.std).mean()))
        print(f"weather fold {k}: ridge {mae(forecast, test.truth):.3f}; boosting on its residuals (step, ridge, "
              "corrected): " + ", ".join(f"{s}: {a:.3f} -> {b:.3f}" for s, a, b in steps))

    def means(scaled: np.ndarray, origins: np.ndarray) -> list[np.ndarray]:
        return [scaled[origins[:, None] + np.arange(1 - 24 * days, 1), 0].mean(1, keepdims=True)
                for days in (3, 7, 14, 30)]

    for label, found in (("72 h of lookback", folds(series)), ("30 days of lookback", folds(weather_series(720))),
                         ("30 days, + 3/7/14/30-day means", folds(weather_series(720), means))):
        show(f"weather ridge, {label}", [mae(f.splits["test"].to_user(ridge(f)[0](f.splits["test"].features), f.std),
                                             f.splits["test"].truth) for f in found], 3)


def probe_coverage() -> None:


    for name, series in (("weather", weather_series()), ("load", load_series())):
        in_sample, oof_cover = [], []
        for fold in folds(series):
            final, train_only, alpha = ridge(fold)
            train, val, test = (fold.splits[s] for s in ("train", "val", "test"))
            forecast = test.to_user(final(test.features), fold.std)
            scale = np.concatenate([train.scale, val.scale])[:, None]
            old = np.concatenate([train.targets - final(train.features), val.targets - train_only(val.features)])
            for residuals, found in ((old, in_sample), (out_of_fold(fold, alpha), oof_cover)):
                low, high = intervals.conformal_offsets(residuals * fold.std / scale, (0.1, 0.9))
                lower, upper = forecast + low * test.scale[:, None], forecast + high * test.scale[:, None]
                found.append(intervals.coverage(test.truth, lower, upper))
        show(f"{name} 80% coverage, in-sample training residuals", in_sample, 3)
        show(f"{name} 80% coverage, 5-block out-of-fold residuals", oof_cover, 3)


def probe_pipeline(names: list[str], overrides: list[str]) -> None:
    """The pipeline's own correction on each fold: per-step test MAE and its size (trains one model per fold)."""
    import tempfile

    import keras

    from seqapps import training
    from seqapps.config import resolve_config
    from seqapps.forecaster import forecast_batches
    from seqapps.pipeline import REGISTRY

    for name in names:
        pipeline = REGISTRY.get(name)()
        config = resolve_config(pipeline.Config, "default", None, [f"backtest_folds={FOLDS}", *overrides])
        frame = pipeline._frame(config, None)
        for k in range(FOLDS):
            data = pipeline._fold_splits(config, frame, None, k)
            keras.utils.set_random_seed(config.seed)
            model = training.build_and_compile(pipeline, config, data, training.make_strategy("auto"))
            pipeline.fit(model, config, data, tempfile.mkdtemp())
            interval = pipeline.calibrate(model, config, data)["interval"]  # the forecast batches carry its scale
            layer = model.get_layer("shrinkage")
            weights = layer.get_weights()[0]
            corrections, forecast = {}, None
            for split in ("train", "test"):
                found = {}
                for label, w in (("model", weights), ("base", 0 * weights)):
                    layer.set_weights([w])
                    batches = list(forecast_batches(model, data.state, data.arrays, data.arrays["origins"][split],
                                                    interval))
                    found[label] = np.concatenate([b[1] for b in batches])
                corrections[split] = found["model"] - found["base"]
                forecast = found["model"]
            layer.set_weights([weights])
            truth = np.concatenate([b[3] for b in batches])
            ridge_forecast = data.arrays["ridge_forecast"]
            correction = corrections["test"]

            def per_step(found: np.ndarray, truth: np.ndarray = truth) -> np.ndarray:
                return np.abs(found - truth).mean(axis=(0, 2))

            print(f"{name} fold {k}: MAE ridge {mae(ridge_forecast, truth):.3f}, model {mae(forecast, truth):.3f}, "
                  f"the correction less its training mean {mae(forecast - corrections['train'].mean(0), truth):.3f}, "
                  f"less its test mean {mae(forecast - correction.mean(0), truth):.3f}; correction size "
                  f"{np.abs(correction).mean():.3f}, mean {correction.mean():.3f}; ridge's mean error "
                  f"{(truth - ridge_forecast).mean():.3f}")
            print("  per-step MAE, ridge:", " ".join(f"{v:.3f}" for v in per_step(ridge_forecast)))
            print("  per-step MAE, model:", " ".join(f"{v:.3f}" for v in per_step(forecast)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("probe", choices=("load", "weather", "coverage", "pipeline"))
    parser.add_argument("--pipelines", default="weather_forecasting,load_forecasting",
                        help="pipeline probe: which pipelines")
    parser.add_argument("--set", action="append", default=[], help="pipeline probe: a config override key=value")
    args = parser.parse_args()
    if args.probe == "pipeline":
        probe_pipeline(args.pipelines.split(","), args.set)
    else:
        {"load": probe_load, "weather": probe_weather, "coverage": probe_coverage}[args.probe]()


if __name__ == "__main__":
    main()
