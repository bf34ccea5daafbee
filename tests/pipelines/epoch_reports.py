"""Checks of a tiny run's epoch metrics and report sections, shared by the sequence pipelines' tests."""
import math
from typing import Any, Sequence

import keras
import numpy as np

from seqapps import serializable
from seqapps.config import resolve_config
from seqapps.export_format import read_export
from seqapps.pipeline import REGISTRY, Pipeline, Splits
from seqapps.report.document import figures_of
from tests.pipelines.report_checks import assert_figures_decode


def last_epoch_values(result: dict[str, Any], names: Sequence[str]) -> dict[str, float]:
    """Checks that ``training.history`` holds ``val_NAME`` once per epoch, finite; returns the last epoch's values."""
    history, epochs = result["training"]["history"], result["training"]["epochs_run"]
    assert epochs >= 1
    for name in names:
        values = history[f"val_{name}"]
        assert len(values) == epochs and all(math.isfinite(value) for value in values), (name, values)
    return {name: history[f"val_{name}"][-1] for name in names}


def reference_log_probs(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``log softmax(logits)[label]`` in float64 NumPy, the max subtracted: the reference for the pipelines' metrics."""
    logits = np.asarray(logits, np.float64)
    top = logits.max(-1, keepdims=True)
    log_norm = (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))[..., 0]
    return np.take_along_axis(logits, np.asarray(labels, np.int64)[..., None], -1)[..., 0] - log_norm


def trained_model_and_data(tiny_exports: dict, name: str) -> tuple[keras.Model, Splits]:
    """The tiny run's trained model (the export's ``model.keras``) and its splits, loaded again from the tiny preset."""
    pipeline = REGISTRY.get(name)()
    config = resolve_config(pipeline.Config, "tiny")
    model = serializable.load_model(read_export(tiny_exports[name]["export"]).keras_model_path)
    return model, pipeline.load_data(config, None)


def assert_sections(name: str, result: dict[str, Any], arrays: dict[str, Any], anchors: Sequence[str],
                    figures: int) -> None:
    """Checks the pipeline's sections: their anchors, ``figures`` PNGs that decode; and that they build without data."""
    pipeline: Pipeline = REGISTRY.get(name)()
    for given, expected in ((arrays, figures), ({}, None)):
        sections = pipeline.report_sections(result, given)
        assert [section.id() for section in sections] == list(anchors)
        found = figures_of(sections)
        if expected is not None:
            assert len(found) == expected, [figure.name for figure in found]
        assert_figures_decode(sections)
