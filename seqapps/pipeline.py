"""The Pipeline contract and the typed registry of named pipelines.

A pipeline says only what is particular to its task: its config, data, model,
metrics with a baseline, and its serving function. Training, export and the
command line are shared (``seqapps.training``, ``seqapps.export``, ``seqapps.cli``).

The registry is lazy so that ``seqapps list`` and ``--help`` do not import
TensorFlow: built-in pipelines are declared in ``pipelines/__init__.py`` as
``name -> "module:Class"``; third-party ones register through the
``seqapps.pipelines`` entry-point group.
"""
from __future__ import annotations

import dataclasses
import importlib
from importlib import metadata
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from seqapps.config import TrainingConfig
from seqapps.errors import ConfigError

if TYPE_CHECKING:
    import keras
    import numpy as np
    import tensorflow as tf

ENTRY_POINT_GROUP = "seqapps.pipelines"


@dataclasses.dataclass
class Splits:
    """What ``load_data`` returns.

    Attributes:
        train, val, test: ``tf.data.Dataset``s of ``(inputs, targets)``, unbatched.
        state: JSON-able facts the model and serving need again (columns, frequency,
            vocabularies); saved in the export for ``predict`` and ``finetune``.
        report: JSON-able facts about the data to show the user (rows, filled values).
        arrays: anything else evaluation needs (for example NumPy targets).
    """

    train: "tf.data.Dataset"
    val: "tf.data.Dataset"
    test: "tf.data.Dataset"
    state: dict[str, Any]
    report: dict[str, Any] = dataclasses.field(default_factory=dict)
    arrays: dict[str, Any] = dataclasses.field(default_factory=dict)


class Pipeline:
    """Base class of a named task pipeline.

    Subclasses set ``Config`` and implement the methods below. ``name`` is set by
    ``register_pipeline``.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    Config: ClassVar[type[TrainingConfig]] = TrainingConfig

    def load_data(self, config: TrainingConfig, data_path: str | None,
                  state: dict[str, Any] | None = None) -> Splits:
        """Reads, validates and splits the data.

        Args:
            config: the resolved config.
            data_path: a user file or folder, or None for the embedded default data.
            state: the state of an earlier export when fine-tuning: the new data must
                match it (same columns, frequency, vocabulary).

        Returns:
            The train/val/test splits and the state to save.
        """
        raise NotImplementedError

    def build_model(self, config: TrainingConfig, data: Splits) -> "keras.Model":
        """Returns an uncompiled Keras model that maps raw inputs to outputs in user units."""
        raise NotImplementedError

    def compile_args(self, config: TrainingConfig, data: Splits) -> dict[str, Any]:
        """Returns ``loss`` and ``metrics`` for ``model.compile``; the optimizer is shared."""
        raise NotImplementedError

    def evaluate(self, model: "keras.Model", data: Splits) -> tuple[dict[str, float], dict[str, Any]]:
        """Returns ``(metrics, baselines)`` on the test split."""
        raise NotImplementedError

    def serving_function(self, model: "keras.Model", data: Splits) -> tuple[Callable, list["tf.TensorSpec"]]:
        """Returns ``(fn, input_signature)``: raw inputs in, readable outputs out."""
        raise NotImplementedError

    def serving_example(self, data: Splits) -> dict[str, "np.ndarray"]:
        """Returns one small batch of raw serving inputs (for warm-up and checks)."""
        raise NotImplementedError

    def predict_inputs(self, state: dict[str, Any], inputs: list[str]) -> dict[str, "np.ndarray"]:
        """Turns ``seqapps predict`` command-line inputs into serving inputs."""
        raise NotImplementedError

    def format_prediction(self, state: dict[str, Any], inputs: dict[str, "np.ndarray"],
                          outputs: dict[str, "np.ndarray"]) -> tuple[str, Any]:
        """Returns ``(text for a terminal, JSON-able value)`` for serving outputs."""
        raise NotImplementedError


class PipelineRegistry:
    """Maps pipeline names to classes, importing a module only when it is used."""

    def __init__(self) -> None:
        self._targets: dict[str, str] = {}
        self._summaries: dict[str, str] = {}
        self._classes: dict[str, type[Pipeline]] = {}

    def declare(self, name: str, target: str, summary: str) -> None:
        """Declares a pipeline by ``"module:Class"`` without importing it."""
        if name in self._targets and self._targets[name] != target:
            raise ValueError(f"pipeline {name!r} is declared twice: {self._targets[name]} and {target}")
        self._targets[name] = target
        self._summaries[name] = summary

    def add(self, name: str, cls: type[Pipeline]) -> None:
        """Records a loaded pipeline class under ``name``."""
        if not (isinstance(cls, type) and issubclass(cls, Pipeline)):
            raise TypeError(f"pipeline {name!r} must be a subclass of seqapps.pipeline.Pipeline, got {cls!r}")
        self._classes[name] = cls

    def names(self) -> list[str]:
        """Returns the sorted names of all declared pipelines."""
        self._load_builtins()
        return sorted(self._targets)

    def summary(self, name: str) -> str:
        """Returns a pipeline's one-line description."""
        self._load_builtins()
        return self._summaries[name]

    def check(self, name: str) -> None:
        """Raises ConfigError unless ``name`` is declared; imports no pipeline module (nor TensorFlow)."""
        names = self.names()
        if name not in self._targets:
            raise ConfigError(f"unknown pipeline {name!r}; choose one of {', '.join(names)}")

    def get(self, name: str) -> type[Pipeline]:
        """Imports and returns the pipeline class registered as ``name``.

        Raises:
            ConfigError: no pipeline has that name.
        """
        self.check(name)
        if name not in self._classes:
            module_name, _, class_name = self._targets[name].partition(":")
            self.add(name, getattr(importlib.import_module(module_name), class_name))
        return self._classes[name]

    def _load_builtins(self) -> None:
        if self._targets:
            return
        importlib.import_module("pipelines")
        for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
            self.declare(entry.name, entry.value, f"third-party pipeline from {entry.value}")


REGISTRY = PipelineRegistry()


def register_pipeline(name: str) -> Callable[[type[Pipeline]], type[Pipeline]]:
    """Class decorator: names a pipeline class and records it in the registry."""

    def decorate(cls: type[Pipeline]) -> type[Pipeline]:
        cls.name = name
        REGISTRY.add(name, cls)
        return cls

    return decorate
