"""Runs a pipeline end to end: config, data, training, evaluation, export; and fine-tuning.

This is the one place that strings the shared parts together, so that every
pipeline is run, fine-tuned and predicted the same way.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Iterable

from seqapps.config import TrainingConfig, check_names, dump_config, resolve_config
from seqapps.errors import DataError, ExportError
from seqapps.export_format import (EXAMPLES_INPUT, LENGTH_INPUT, Limits, read_examples_signatures, read_export,
                                   read_limits)
from seqapps.metrics import nan_reason
from seqapps.pipeline import REGISTRY, Pipeline, Splits
from seqapps.report import run_folder

TFDS_PREFIX = "tfds:"


def check_data_path(data_path: str | None) -> None:
    """Checks, before TensorFlow is imported, that ``--data`` names something that exists.

    Raises:
        DataError: the path is neither a ``tfds:NAME`` nor an existing file or folder.
    """
    if data_path and not data_path.startswith(TFDS_PREFIX) and not Path(data_path).exists():
        raise DataError(f"{data_path}: file not found")


def _check_config_names(name: str, preset: str | None, config_file: str | None,
                        overrides: tuple[str, ...] | list[str]) -> None:
    """Checks the preset, config file and ``--set`` field names from the pipeline's source, before TensorFlow."""
    outline = REGISTRY.config_outline(name)
    if outline is not None:
        check_names(outline.class_name, outline.fields, outline.presets, preset, config_file, overrides)


def json_safe(value: Any, nulls: dict[str, str], path: str = "") -> Any:
    """Returns ``value`` with every NaN or infinite float replaced by None, so that it is valid JSON.

    Args:
        value: a JSON-able structure (NumPy scalars are converted).
        nulls: filled with ``{dotted.path: reason}`` for each value replaced: the reason the metric's
            definition gives (``seqapps.metrics.nan_reason``), else the value.
        path: the dotted path of ``value`` (for the reasons).
    """
    if isinstance(value, dict):
        return {key: json_safe(item, nulls, f"{path}.{key}" if path else str(key)) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item, nulls, f"{path}[{i}]") for i, item in enumerate(value)]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", None) == 0:
        value = value.item()  # a NumPy scalar
    if isinstance(value, float) and not math.isfinite(value):
        nulls[path] = nan_reason(path) or f"could not be computed ({value})"
        return None
    return value


def _checkpoint_dir(model_root: Path, key: dict[str, Any]) -> Path:
    """The backup folder of one run: the same command (pipeline, config, data) finds it again."""
    digest = hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return model_root / ".checkpoints" / digest


def backtest_summary(folds: list[tuple[dict[str, Any], dict[str, Any]]],
                     periods: list[Any]) -> dict[str, Any]:
    """The mean and spread of every metric of the model and of each baseline over backtest folds.

    Args:
        folds: ``(metrics, baselines)`` of each fold, as ``Pipeline.evaluate`` returns them.
        periods: what each fold tested on (for the report).

    Returns:
        ``{"folds", "periods", "metrics": {metric: {"mean", "std", "values"}}, "baseline":
        {name: {metric: ...}}}``; ``std`` is the sample standard deviation (ddof 1). A metric that is
        a list (forecasting's ``mae_by_lead``) gets a mean and spread per element.
    """
    import numpy as np

    def spread(scores: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        values = {key: np.array([score[key] for score in scores], "float64") for key in scores[0]}
        return {key: {"mean": v.mean(axis=0).tolist(),
                      "std": (v.std(axis=0, ddof=1) if len(v) > 1 else np.zeros_like(v[0])).tolist(),
                      "values": v.tolist()} for key, v in values.items()}

    return {"folds": len(folds), "periods": periods, "metrics": spread([m for m, _ in folds]),
            "baseline": {name: spread([b[name] for _, b in folds]) for name in folds[0][1]}}


def _fit_calibrate_evaluate(pipeline: Pipeline, config: TrainingConfig, data: Splits, checkpoint_dir: Path,
                            strategy: Any, progress: str, load_model: Any = None,
                            log_dir: Path | None = None) -> tuple[Any, Splits, dict[str, Any], Any]:
    """Builds (or loads) and trains a model, calibrates it and measures it; ``log_dir`` gets its TensorBoard logs.

    Returns:
        ``(model, data, fitted, (metrics, baselines))``: ``data`` with the calibrated state (what
        the export saves); ``fitted`` holds the training report and, with ``load_model``, the loaded
        model's metrics before training (``metrics_before``).
    """
    import keras

    from seqapps import training

    keras.utils.set_random_seed(config.seed)
    model = training.build_and_compile(pipeline, config, data, strategy, load_model=load_model)
    before = pipeline.evaluate(model, config, data)[0] if load_model else None
    report = pipeline.fit(model, config, data, checkpoint_dir, progress=progress, log_dir=log_dir)
    data = dataclasses.replace(data, state={**data.state, **pipeline.calibrate(model, config, data)})
    fitted = {"training": report, "metrics_before": before}
    return model, data, fitted, pipeline.evaluate(model, config, data)


def _train_evaluate_export(pipeline: Pipeline, config: TrainingConfig, preset: str, data: Splits,
                           model_root: Path, checkpoint_key: dict[str, Any], strategy: Any,
                           progress: str, logdir: Path, load_model: Any = None,
                           earlier_folds: Iterable[Splits] = ()) -> dict[str, Any]:
    """Builds (or loads), trains, calibrates, evaluates and, on the chief, exports; returns the result fields.

    With ``earlier_folds`` (a backtest), a fresh model is trained and scored on each of
    them too, and ``backtest`` summarises them with this run's split as the last fold.
    The training backups are removed only once the export is in place: a run killed
    during evaluation or export resumes after its last epoch instead of training again.
    On the chief, the run logs into its pending run folder under ``logdir``, and the
    pipeline's report data is saved there once the export exists (``run_folder``, in
    the result: ``finish_run_folder`` completes it).
    """
    from seqapps import export, training

    checkpoint_dir = _checkpoint_dir(model_root, checkpoint_key)
    pending = None
    if training.is_chief(strategy):
        pending = run_folder.pending_folder(logdir, pipeline.name, checkpoint_dir.name)
        if not checkpoint_dir.exists():  # a fresh start: logs left by an earlier, finished command are not this run's
            shutil.rmtree(pending, ignore_errors=True)
    model, data, fitted, (metrics, baseline) = _fit_calibrate_evaluate(pipeline, config, data, checkpoint_dir,
                                                                      strategy, progress, load_model, pending)
    result: dict[str, Any] = {"metrics": metrics, "baseline": baseline}
    if fitted["metrics_before"] is not None:
        result["metrics_before"] = fitted["metrics_before"]
    folds, periods, fold_dirs, notes = [], [], [], []
    for index, fold in enumerate(earlier_folds):
        fold_dirs.append(_checkpoint_dir(model_root, {**checkpoint_key, "backtest_fold": index}))
        _, _, fold_fitted, scores = _fit_calibrate_evaluate(pipeline, config, fold, fold_dirs[-1], strategy, progress)
        folds.append(scores)
        notes.append(fold_fitted["training"].get("note"))
        periods.append(fold.report.get("test_period"))
    if folds:
        result["backtest"] = backtest_summary([*folds, (metrics, baseline)], [*periods, data.report.get("test_period")])
        notes.append(fitted["training"].get("note"))
        if any(notes):
            result["backtest"]["notes"] = notes
    result.update(training=fitted["training"], data=data.report)
    nulls: dict[str, str] = {}
    result = json_safe(result, nulls)  # the export's metrics.json and --json are standard JSON
    if nulls:
        result["nulls"] = nulls
    if not training.is_chief(strategy):
        for folder in [checkpoint_dir, *fold_dirs]:
            training.remove_backup(folder, strategy)
        result["export"] = None
        return result
    path = export.write_export(pipeline.serving_module(model, config, data), model_root,
                               dump_config(config, pipeline.name, preset), result, data.state,
                               limits=pipeline.limits(config, data))
    try:  # the report is never required: a pipeline whose figures fail still exports
        run_folder.save_report_data(pending, pipeline.report_data(model, config, data, export.ExportCalls(path)))
    except Exception as error:
        print(f"seqapps: report data not saved ({type(error).__name__}: {error})", file=sys.stderr)
    for folder in [checkpoint_dir, *fold_dirs]:
        training.remove_backup(folder, strategy)
    result["export"] = str(path)
    result["run_folder"] = str(pending)
    return result


def finish_run_folder(result: dict[str, Any], config: TrainingConfig) -> dict[str, Any]:
    """Completes the run folder (result, TensorBoard test logs, report) and names it after the export.

    Returns:
        ``result`` with ``run_folder`` the final folder and ``report`` the report's path (None where
        it could not be built); unchanged on a worker that exported nothing.
    """
    if result.get("export") is None:
        result.pop("run_folder", None)
        return result
    folder = run_folder.finish(Path(result["run_folder"]), {k: v for k, v in result.items() if k != "run_folder"},
                               config.to_dict())
    report = folder / run_folder.REPORT_FILE
    return {**result, "run_folder": str(folder), "report": str(report) if report.is_file() else None}


def run(name: str, preset: str = "default", data_path: str | None = None, config_file: str | None = None,
        overrides: tuple[str, ...] | list[str] = (), out: str | Path = "saved_models", strategy: str = "auto",
        progress: str = "none", logdir: str | Path | None = None) -> dict[str, Any]:
    """Trains, evaluates and exports a named pipeline.

    Args:
        name: a registered pipeline name.
        preset: "tiny", "default" or "full".
        data_path: the user's data, or None for the embedded default data.
        config_file: optional YAML config.
        overrides: ``key=value`` config overrides.
        out: the export root; the export goes to ``out/name/<version>``.
        strategy: "auto", "mirrored" or "multiworker".
        progress: "bar", "lines" or "none" (see ``seqapps.training.fit``).
        logdir: where the run folder goes (``logdir/name/<version>``: TensorBoard logs and
            ``report.html``); default: ``runs`` beside ``out``.

    Returns:
        ``{"pipeline", "preset", "metrics", "baseline", "export", "run_folder", "report", "seconds", ...}``.
    """
    start = time.perf_counter()
    REGISTRY.check(name)  # names and files first: they need no TensorFlow
    check_data_path(data_path)
    _check_config_names(name, preset, config_file, overrides)
    pipeline_class = REGISTRY.get(name)
    from seqapps.training import make_strategy

    config = resolve_config(pipeline_class.Config, preset, config_file, overrides)
    distribution = make_strategy(strategy)  # before other TensorFlow work, as multi-worker needs
    pipeline = pipeline_class()
    data = pipeline.load_data(config, data_path)
    key = {"pipeline": name, "config": config.to_dict(), "data": str(Path(data_path).resolve()) if data_path else None}
    result = _train_evaluate_export(pipeline, config, preset, data, Path(out) / name, key, distribution, progress,
                                    Path(logdir) if logdir else run_folder.default_logdir(Path(out).parent),
                                    earlier_folds=pipeline.backtest_splits(config, data_path))
    result = {"pipeline": name, "preset": preset, **result, "seconds": round(time.perf_counter() - start, 1)}
    return finish_run_folder(result, config)


def finetune(name: str, from_path: str | Path, data_path: str, overrides: tuple[str, ...] | list[str] = (),
             strategy: str = "auto", progress: str = "none", logdir: str | Path | None = None) -> dict[str, Any]:
    """Continues training an export's model on new data and exports the next version.

    Args:
        name: the pipeline the export belongs to.
        from_path: ``saved_models/NAME/VERSION`` (or ``saved_models/NAME`` for the latest).
        data_path: the user's data; it must match the export's columns and format.
        overrides: ``key=value`` config overrides on top of the export's saved config.
        strategy: "auto", "mirrored" or "multiworker".
        progress: "bar", "lines" or "none" (see ``seqapps.training.fit``).
        logdir: where the run folder goes; default: ``runs`` beside the export root.

    Returns:
        The run result with ``metrics_before`` (the loaded model on the new test split),
        ``metrics`` after fine-tuning, and the new ``export``.
    """
    start = time.perf_counter()
    REGISTRY.check(name)
    if not data_path:
        raise DataError("finetune needs --data PATH with your own data")
    check_data_path(data_path)
    _check_config_names(name, None, None, overrides)
    info = read_export(from_path)  # before TensorFlow is imported: a wrong --from is told at once
    if info.pipeline != name:
        raise ExportError(f"{info.path}: is an export of {info.pipeline!r}, not {name!r}")
    pipeline_class = REGISTRY.get(name)
    from seqapps.training import make_strategy

    config = resolve_config(pipeline_class.Config, info.preset, None, overrides, base=info.config)
    distribution = make_strategy(strategy)
    pipeline = pipeline_class()
    data = pipeline.load_data(config, data_path, state=info.state)

    def load_model() -> Any:
        from seqapps import serializable

        return serializable.load_model(info.keras_model_path)

    key = {"pipeline": name, "config": config.to_dict(), "data": str(Path(data_path).resolve()),
           "from": str(info.path.resolve())}
    result = _train_evaluate_export(pipeline, config, info.preset, data, info.path.parent, key, distribution, progress,
                                    Path(logdir) if logdir else run_folder.logdir_of_export(info.path),
                                    load_model=load_model)
    result = {"pipeline": name, "preset": info.preset, "finetuned_from": str(info.path), **result,
              "seconds": round(time.perf_counter() - start, 1)}
    return finish_run_folder(result, config)


def refresh_report(path: str | Path, data_path: str | None = None, logdir: str | Path | None = None) -> Path:
    """Collects an export's report data again and rebuilds its run's report (``seqapps report --refresh``).

    For an export made before its pipeline drew figures (or before reports existed): the
    pipeline's ``report_data`` runs on the export's model and signatures and on the data it was
    trained on, read again with the export's saved state.

    Args:
        path: a run folder (its ``result.json`` names the export) or an export.
        data_path: the data the export was trained on; None for the embedded default data.
        logdir: where an export's run folder is (as for ``seqapps.report.run_folder.rebuild``).

    Returns:
        The report's path.
    """
    from seqapps import export, serializable

    saved = Path(path) / run_folder.RESULT_FILE
    export_path = json.loads(saved.read_text(encoding="utf-8"))["export"] if saved.is_file() else path
    check_data_path(data_path)
    info = read_export(export_path)
    pipeline = REGISTRY.get(info.pipeline)()
    config = resolve_config(pipeline.Config, info.preset, None, (), base=info.config)
    data = dataclasses.replace(pipeline.load_data(config, data_path, state=info.state), state=info.state)
    model = serializable.load_model(info.keras_model_path)
    folder = Path(path) if saved.is_file() else run_folder.run_folder_of(info, logdir)
    run_folder.save_report_data(folder, pipeline.report_data(model, config, data, export.ExportCalls(info.path)))
    return run_folder.rebuild(folder, logdir)


def predict(model_path: str | Path, inputs: list[str], signature_name: str = "serving_default",
            overrides: tuple[str, ...] | list[str] = ()) -> tuple[str, Any]:
    """Runs one of an export's signatures on command-line inputs.

    A classify or regress signature (TF Serving's tf.Example APIs) gets the inputs of the signature it
    wraps, built as for that one and sent as serialized ``tf.train.Example``s; its answer (``classes``
    and ``scores``, or ``outputs``) is printed row by row as it is.

    Args:
        model_path: ``saved_models/NAME[/VERSION]``.
        inputs: pipeline-specific raw inputs (a CSV path for forecasting, text for text models).
        signature_name: the signature to call.
        overrides: ``input=value`` strings that set (or replace) a signature input; a
            scalar or a list is broadcast to every row (``temperature=0.5``, ``top_k=5``).

    Returns:
        ``(text, json_value)`` as the pipeline formats them.

    Raises:
        ExportError: the export has no such signature.
        DataError: an override names no input of the signature, or its value does not fit.
    """
    import tensorflow as tf

    from seqapps.export import call_in_batches, serialize_examples
    from seqapps.pipeline import SignatureSpec

    info = read_export(model_path)
    pipeline = REGISTRY.get(info.pipeline)()
    loaded = tf.saved_model.load(str(info.path))
    if signature_name not in loaded.signatures:
        raise ExportError(f"{info.path}: no signature {signature_name!r}; it has {', '.join(loaded.signatures)}")
    function = loaded.signatures[signature_name]
    wrapped = read_examples_signatures(info.path).get(signature_name)
    spec = SignatureSpec(inputs=loaded.signatures[wrapped or signature_name].structured_input_signature[1])
    built = pipeline.predict_inputs(info.state, inputs, spec)  # keys the signature lacks are row metadata
    features = {name: value for name, value in built.items() if name in spec.inputs}
    features.update(_input_overrides(overrides, spec.inputs, features, signature_name, read_limits(info.path)))
    for name, value in features.items():
        for text in (value.ravel() if value.dtype == object else ()):
            if isinstance(text, str) and not _is_utf8(text):
                raise DataError(f"INPUT {os.fsencode(text)!r} (input {name!r}): not UTF-8 text; expected UTF-8 text")
    missing = [name for name in spec.inputs if name not in features]
    if missing == [EXAMPLES_INPUT]:  # an export written before examples_signatures.json
        raise DataError(f"signature {signature_name!r} serves TF Serving's Classify or Regress API (serialized "
                        "tf.Examples); seqapps predict gives the same answer with serving_default")
    if missing:
        raise DataError(f"signature {signature_name!r} needs input {missing[0]!r}; pass --set {missing[0]}=VALUE")
    if wrapped:
        features = {EXAMPLES_INPUT: serialize_examples({name: features[name] for name in spec.inputs})}
    outputs = call_in_batches(function, features, pipeline.predict_rows_per_call)
    return pipeline.format_answer(info.state, {**built, **features}, outputs, signature_name, inputs)


def _input_overrides(overrides: tuple[str, ...] | list[str], specs: dict[str, Any], features: dict[str, Any],
                     signature_name: str, limits: Limits | None = None) -> dict[str, Any]:
    """Parses ``--set input=value`` into arrays of each input's dtype and shape, one row per batch row.

    Integer values must fit the input's dtype, float values be finite, and a generated length
    (``length`` or ``*_length``) stay within the export's ``max_generated_length``.
    """
    import numpy as np
    import yaml

    rows = len(next(iter(features.values()))) if features else 1
    parsed = {}
    for item in overrides:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or name not in specs:
            raise DataError(f"--set {item!r}: expected INPUT=VALUE with INPUT one of signature {signature_name!r}'s "
                            f"inputs: {', '.join(sorted(specs))}")
        spec = specs[name]
        dtype = object if spec.dtype.name == "string" else spec.dtype.as_numpy_dtype
        try:
            value = raw if dtype is object else yaml.safe_load(raw)
            _within_range(item, name, np.asarray(value), spec.dtype, limits)
            array = np.asarray(value, dtype=dtype)
            shape = [rows, *(dim if dim is not None else array.shape[-1] for dim in spec.shape.as_list()[1:])]
            parsed[name] = np.broadcast_to(array, shape).copy()
        except (ValueError, TypeError, IndexError, yaml.YAMLError):
            raise DataError(f"--set {item!r}: expected {spec.dtype.name} values for input {name!r} of shape "
                            f"{spec.shape.as_list()} (the batch first)") from None
    return parsed


def _within_range(item: str, name: str, value: Any, dtype: Any, limits: Limits | None) -> None:
    """Refuses a ``--set`` value outside its input's dtype, or a generated length past the export's limit."""
    import numpy as np

    numbers = np.ravel(value).tolist()
    if dtype.is_integer and numbers and all(isinstance(number, int) for number in numbers):
        info = np.iinfo(dtype.as_numpy_dtype)
        bound = limits.max_generated_length if limits is not None and LENGTH_INPUT.fullmatch(name) else None
        if bound is not None and max(numbers) > bound:
            raise DataError(f"--set {item}: {name} is at most {bound} for this export (limits.json "
                            "max_generated_length)")
        if min(numbers) < info.min or max(numbers) > info.max:
            raise DataError(f"--set {item}: {name} is a {dtype.name}, from {info.min} to {info.max}")
    if dtype.is_floating and value.dtype.kind in "iuf" and not np.isfinite(value.astype(np.float64)).all():
        raise DataError(f"--set {item}: expected a finite number for {name}")


def _is_utf8(text: str) -> bool:
    """Whether a command-line string is UTF-8 text (not bytes Python kept as lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
