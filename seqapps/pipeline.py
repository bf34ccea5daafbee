"""The Pipeline contract and the typed registry of named pipelines.

A pipeline says only what is particular to its task: its config, data, model,
metrics with a baseline, and its serving function. Training, export and the
command line are shared (``seqapps.training``, ``seqapps.export``, ``seqapps.cli``).

Every pipeline, built-in or third-party, registers the same way: an entry point
``NAME = module:Class`` in the ``seqapps.pipelines`` group (see ``setup.cfg``). The
registry is lazy, so that ``seqapps list`` and ``--help`` import no TensorFlow: a
pipeline's summary is the first line of its class docstring, read from the module's
source without importing it. The library imports no pipeline module until one is used.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
from importlib import metadata
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Sequence

from seqapps.config import TrainingConfig
from seqapps.errors import ConfigError, DataError
from seqapps.export_format import EXAMPLES_INPUT

if TYPE_CHECKING:
    from pathlib import Path

    import keras
    import numpy as np
    import tensorflow as tf

    from seqapps.export import ExportCalls, Limits, ServingModule, Signature
    from seqapps.report.document import Section

ENTRY_POINT_GROUP = "seqapps.pipelines"

#: ``Splits.report`` keys that the run summary (``seqapps.cli``) shows; every pipeline that reads
#: user data fills them. ``SPLIT_COUNTS``: ``{"unit": "images", "train": 19, "val": 3, "test": 3}``,
#: the items each split holds. ``VOCABULARIES``: ``{"target words": {"added": [...], "size": 812,
#: "oov_rate": 0.012}, "tags": {"added": [...], "removed": [...], "size": 9}}``, one entry per
#: vocabulary (words, characters, tags) with what fine-tuning added (or removed) and the share of
#: test tokens still unknown afterwards (None where no token can be unknown).
SPLIT_COUNTS = "split_counts"
VOCABULARIES = "vocabularies"
#: ``predict_inputs`` may return keys that are not inputs of the signature: row metadata, which
#: ``seqapps predict`` does not send but passes on to ``format_prediction`` in ``inputs``.
#: ``INPUT_INDEX``, int [rows]: the command-line INPUT each row came from, for a pipeline that cuts
#: one INPUT into several rows (``row_inputs`` reads it).
INPUT_INDEX = "input_index"
#: the most validation examples (windows, sequences, images) a pipeline's ``epoch_metrics`` reads: the first
#: ones, the same every epoch, so that measuring after each epoch costs little more than Keras' validation loss.
EPOCH_METRIC_EXAMPLES = 1024


@dataclasses.dataclass(frozen=True)
class Headline:
    """One of a pipeline's headline metrics, as the run summary and the docs show it.

    Attributes:
        key: its key in the model's ``metrics``.
        label: the column's title (default: ``key``).
        unit: printed in the title ("MW", "°C", "%", "bits/char").
        scale: the value is multiplied by it for display (100 for a fraction shown in %).
        baseline_key: its key in each baseline's dict, where the baselines name it otherwise
            (a model's ``greedy_cer`` against a baseline's ``cer``); default ``key``. A baseline
            without it shows ``n/a``.
        higher_is_better: False for errors and losses.
        optional: only some runs hold it (a split that only some data gives, such as music's held-out
            soundfont, which the pip-only renderer of ``tiny`` and a user's folder lack); the summary
            leaves it out of a run without it.
    """

    key: str
    label: str = ""
    unit: str = ""
    scale: float = 1.0
    baseline_key: str = ""
    higher_is_better: bool = True
    optional: bool = False

    def title(self) -> str:
        """The column's title: the label, with the unit in brackets."""
        return f"{self.label or self.key}" + (f" ({self.unit})" if self.unit else "")

    def value(self, metrics: dict[str, Any], baseline: bool = False) -> float | None:
        """This metric in a model's (or, with ``baseline``, a baseline's) metrics, scaled; None when absent."""
        found = metrics.get((self.baseline_key or self.key) if baseline else self.key)
        return None if not isinstance(found, (int, float)) or isinstance(found, bool) else self.scale * found


@dataclasses.dataclass
class Splits:
    """What ``load_data`` returns.

    Attributes:
        train, val, test: ``tf.data.Dataset``s of ``(inputs, targets)``, unbatched.
        state: JSON-able facts the model and serving need again (columns, frequency,
            vocabularies); saved in the export for ``predict`` and ``finetune``.
        report: JSON-able facts about the data to show the user (rows, filled values).
        arrays: anything else evaluation needs (for example NumPy targets).
        padding_values: what each component of an element of varying length is padded with in a batch, a
            structure like the element's (None: zeros); ``seqapps.training.batch_datasets`` pads with it.
        batch_map: a function ``batch_datasets`` applies to every padded training and validation batch, called as
            ``tf.data.Dataset.map`` calls it (None: none).
    """

    train: "tf.data.Dataset"
    val: "tf.data.Dataset"
    test: "tf.data.Dataset"
    state: dict[str, Any]
    report: dict[str, Any] = dataclasses.field(default_factory=dict)
    arrays: dict[str, Any] = dataclasses.field(default_factory=dict)
    padding_values: Any = None
    batch_map: Callable[..., Any] | None = None


class Pipeline:
    """Base class of a named task pipeline.

    The stages, in the order ``seqapps.runner`` calls them, each given the config and the splits::

        load_data -> build_model -> fit -> calibrate -> evaluate -> serving_module (the export)

    A subclass sets ``Config`` and implements ``load_data``, ``build_model``, ``compile_args``,
    ``evaluate`` and ``serving_module``. ``fit`` (the shared training loop), ``calibrate`` (nothing),
    ``limits``, ``predict_inputs`` and ``format_prediction`` have defaults; override them where the
    task knows better. A stage passes what it learns only through what it returns: a pipeline
    keeps no state of its own (no ``self.*``) and attaches nothing to a Keras model. ``name`` is
    set by the registry.
    """

    name: ClassVar[str] = ""
    Config: ClassVar[type[TrainingConfig]] = TrainingConfig
    #: what ``seqapps predict`` takes as INPUT (shown by ``seqapps predict --help``; a string literal).
    predict_input: ClassVar[str] = "one text per row for the signature's string input"
    #: the metrics the run summary shows first, beside every baseline that has them (declared once).
    headline_metrics: ClassVar[tuple[Headline, ...]] = ()
    #: the most rows ``seqapps predict`` sends to the export in one call (None: all rows at once); a
    #: pipeline that cuts long inputs into many rows sets it, so memory does not grow with an input's length.
    predict_rows_per_call: ClassVar[int | None] = None

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

    def backtest_splits(self, config: TrainingConfig, data_path: str | None) -> Iterator[Splits]:
        """The splits of the earlier folds of a backtest, oldest first; default: none.

        ``seqapps run`` trains and scores a fresh model on each, and reports every metric's
        mean and spread over them and the run's own split (the last fold).
        """
        return iter(())

    def build_model(self, config: TrainingConfig, data: Splits) -> "keras.Model":
        """Returns an uncompiled Keras model that maps raw inputs to outputs in user units."""
        raise NotImplementedError

    def adapt_model(self, model: "keras.Model", config: TrainingConfig, data: Splits) -> "keras.Model":
        """Fits a model loaded for fine-tuning to the new data (for example new output classes); default: unchanged.

        Args:
            model: the exported model, loaded.
            config: the resolved config.
            data: the fine-tuning splits (their state may extend the export's).

        Returns:
            The model to continue training.
        """
        return model

    def compile_args(self, config: TrainingConfig, data: Splits) -> dict[str, Any]:
        """Returns ``loss`` and ``metrics`` for ``model.compile``; the optimizer is shared."""
        raise NotImplementedError

    def fit(self, model: "keras.Model", config: TrainingConfig, data: Splits, checkpoint_dir: "Path",
            progress: str = "none", log_dir: "Path | None" = None) -> dict[str, Any]:
        """Trains a compiled model; default: the shared loop, ``seqapps.training.fit``.

        Override it to wrap that loop (for example to fit something on a held-out split first).

        Args:
            model: the compiled model (built under the run's strategy).
            config: the resolved config.
            data: the splits.
            checkpoint_dir: the run's backup folder (removed once the export is in place;
                a wrapper may keep more backups in subfolders of it).
            progress: as for ``seqapps.training.fit``.
            log_dir: the run's TensorBoard folder (None: no logs, as on a worker that is not the chief).

        Returns:
            The JSON-able training report; its ``note``, if any (one line of what the fit decided),
            is printed in the run's summary.
        """
        from seqapps import training

        return training.fit(model, data, config, checkpoint_dir, progress=progress, log_dir=log_dir,
                            epoch_metrics=lambda trained: self.epoch_metrics(trained, config, data))

    def epoch_metrics(self, model: "keras.Model", config: TrainingConfig, data: Splits) -> dict[str, float]:
        """The pipeline's validation metrics after each epoch; default: none (Keras' own metrics are logged anyway).

        They are logged as ``val_NAME`` beside the loss (TensorBoard, ``training.history`` and the
        report's training curves). Keep it cheap: it runs on the validation split every epoch.

        Args:
            model: the model being trained.
            config: the resolved config.
            data: the splits (use ``val``, never ``test``).

        Returns:
            ``{name: value}``, names without the ``val_`` prefix (``ppl_full``, ``accuracy``, ``bpc``).
        """
        return {}

    def calibrate(self, model: "keras.Model", config: TrainingConfig, data: Splits) -> dict[str, Any]:
        """Fits what the trained model serves with on held-out data; default: nothing.

        The one stage that adds to the saved state: the runner merges the dict it returns into
        ``data.state`` before ``evaluate`` and the export (decision thresholds, interval widths,
        the beam's length penalty). It must not use the test split.

        Args:
            model: the trained model.
            config: the resolved config.
            data: the splits.

        Returns:
            JSON-able state entries to add (or replace).
        """
        return {}

    def evaluate(self, model: "keras.Model", config: TrainingConfig,
                 data: Splits) -> tuple[dict[str, float], dict[str, Any]]:
        """Measures the model and its baselines on the test split; changes nothing.

        Args:
            model: the trained model.
            config: the resolved config.
            data: the splits, their state calibrated.

        Returns:
            ``(metrics, baselines)``: the model's metrics, and each baseline's by name.
        """
        raise NotImplementedError

    def serving_module(self, model: "keras.Model", config: TrainingConfig, data: Splits) -> "ServingModule":
        """Returns what the export serves: the model, its lookup tables and its signatures.

        Each signature maps raw inputs (with a leading batch dimension) to readable outputs,
        preprocessing and postprocessing in the graph; ``serving_default`` is required. The
        module owns every resource a signature reads (``ServingModule(resources=...)``), so
        that the export saves it.

        Args:
            model: the trained model.
            config: the resolved config.
            data: the splits, their state calibrated (the state the export saves).
        """
        raise NotImplementedError

    def report_data(self, model: "keras.Model", config: TrainingConfig, data: Splits,
                    export: "ExportCalls") -> dict[str, "np.ndarray"]:
        """The arrays the pipeline's report figures are drawn from; default: none.

        Called once the export is in place. Take a few test examples through the export's own
        signatures (``export("align", inputs)``), so that the report shows what the export serves;
        keep it small (a few examples: the report stays under 10 MB).

        Args:
            model: the trained model.
            config: the resolved config.
            data: the splits, their state calibrated.
            export: calls a signature of the written export on NumPy inputs.

        Returns:
            Flat ``{name: array}`` (saved as ``report_data.npz`` in the run folder, without pickles:
            strings as Unicode arrays; one entry per example where shapes differ, ``attention/0``).
        """
        return {}

    def report_sections(self, result: dict[str, Any], arrays: dict[str, "np.ndarray"]) -> "list[Section]":
        """The pipeline's own report sections, after the shared ones (config, data, training, headlines).

        Drawn from the run's result and ``report_data``'s arrays only (``seqapps report`` rebuilds the
        report from them without training); an array that is missing (a run from before, or an
        export without a run folder) leaves its figure out. Each figure is also logged to TensorBoard.

        Args:
            result: the run's result (``result.json``: metrics, baselines, training, data, config).
            arrays: the report data (possibly empty).

        Returns:
            ``seqapps.report.document.Section``s; figures from ``seqapps.report.plots``.
        """
        return []

    def limits(self, config: TrainingConfig, data: Splits) -> "Limits":
        """Returns the request bounds the export carries and servers enforce (default: batch only)."""
        from seqapps.export import Limits

        return Limits()

    def predict_inputs(self, state: dict[str, Any], inputs: list[str],
                       signature: "Signature | SignatureSpec") -> dict[str, "np.ndarray"]:
        """Turns ``seqapps predict`` command-line inputs into inputs of ``signature``.

        The default serves signatures with one string input: each INPUT is one row. Keys that are
        not inputs of the signature are row metadata for ``format_prediction`` (``INPUT_INDEX``).

        Args:
            state: the export's pipeline state.
            inputs: the command-line INPUT strings.
            signature: the signature to call (its ``inputs`` specs are read).

        Raises:
            DataError: the inputs do not fit the signature.
        """
        import numpy as np

        strings = [name for name, spec in signature.inputs.items() if spec.dtype.name == "string"]
        if len(signature.inputs) != 1 or len(strings) != 1:
            raise DataError(f"this signature takes {', '.join(signature.inputs)}; "
                            "the pipeline does not say how to build them from command-line inputs")
        return {strings[0]: np.array(inputs, dtype=object)}

    def write_sample_data(self, folder: "Path", seed: int = 0) -> "tuple[str | None, list[str]]":
        """Writes a small data set of the user's kind, in the format ``--data`` reads (tests and docs).

        It holds a few dozen items (24-40) and, where the task has a vocabulary or label set, some
        words, characters or tags that the tiny preset's data lacks, so that fine-tuning must add them.

        Args:
            folder: an empty folder to write into.
            seed: makes the content.

        Returns:
            ``(data_path, predict_inputs)``: what to pass as ``--data`` (None for a pipeline that
            reads no user data), and ``seqapps predict`` INPUTs of the pipeline's own kind (files or
            texts) for the pipeline's export.
        """
        raise NotImplementedError

    def format_prediction(self, state: dict[str, Any], inputs: dict[str, "np.ndarray"],
                          outputs: dict[str, "np.ndarray"], signature: str = "serving_default",
                          given: "Sequence[str]" = ()) -> tuple[str, Any]:
        """Returns ``(text for a terminal, JSON-able value)`` for one call of ``signature``.

        Every signature of the export must be formatted, and each row of the text names its
        input. The default (``format_rows``) prints each row's outputs by name under the INPUT
        it came from; pipelines override it for the signatures they can say better.

        Args:
            state: the export's pipeline state.
            inputs: the signature's inputs, as ``predict_inputs`` built them, with its row metadata.
            outputs: the signature's outputs, as NumPy arrays with a leading batch dimension.
            signature: the signature's name.
            given: the command-line INPUTs, one per row unless ``inputs[INPUT_INDEX]`` maps the
                rows to them (``row_inputs``).
        """
        return format_rows(row_inputs(given, inputs, len(next(iter(outputs.values()), ()))), outputs)

    def format_answer(self, state: dict[str, Any], inputs: dict[str, "np.ndarray"], outputs: dict[str, "np.ndarray"],
                      signature: str = "serving_default", given: "Sequence[str]" = ()) -> tuple[str, Any]:
        """``format_prediction``, except for a classify or regress signature (its one input the serialized
        tf.Examples, ``EXAMPLES_INPUT``): TF Serving's answer (``classes`` and ``scores``, or ``outputs``) is
        printed row by row as it is (``format_rows``), whatever the pipeline's own signatures print.
        """
        if EXAMPLES_INPUT in inputs:
            return format_rows(row_inputs(given, inputs, len(inputs[EXAMPLES_INPUT])), outputs)
        return self.format_prediction(state, inputs, outputs, signature, given)


@dataclasses.dataclass(frozen=True)
class SignatureSpec:
    """The inputs of a loaded SavedModel signature, in the shape ``predict_inputs`` reads."""

    inputs: dict[str, Any]


def row_inputs(given: Sequence[str], inputs: dict[str, Any], rows: int) -> list[str]:
    """The command-line INPUT of each row: ``given`` in order, or as ``inputs[INPUT_INDEX]`` maps rows to it.

    Args:
        given: the command-line INPUTs (a row beyond them is named ``row N``).
        inputs: ``predict_inputs``' arrays and row metadata.
        rows: the batch size.
    """
    indices = inputs.get(INPUT_INDEX, range(rows))
    return [given[index] if index < len(given) else f"row {index + 1}" for index in map(int, indices)]


def format_rows(given: Sequence[str], outputs: dict[str, "np.ndarray"]) -> tuple[str, Any]:
    """Any signature's outputs, readable: a block per row, headed by the INPUT it came from.

    Args:
        given: the command-line INPUTs, one per row (rows beyond them are numbered).
        outputs: output name -> array with a leading batch dimension.

    Returns:
        ``(text, {"rows": [{"input": ..., output name: value, ...}]})``; strings are decoded, floats
        rounded to 6 digits (4 significant digits in the text), an empty string shows as ``(empty)``.
    """
    values = {name: jsonable(array) for name, array in outputs.items()}
    rows = max((len(v) for v in values.values() if isinstance(v, list)), default=0)
    found, lines = [], []
    for row in range(rows):
        name = given[row] if row < len(given) else f"row {row + 1}"
        record = {"input": name, **{key: value[row] for key, value in values.items() if isinstance(value, list)}}
        found.append(record)
        lines.append(f"{name}:")
        lines += [f"  {key}: {_readable(value)}" for key, value in record.items() if key != "input"]
    return "\n".join(lines), {"rows": found}


def _readable(value: Any, limit: int = 12) -> str:
    """A short text of one output value: strings as they are, floats to 4 digits, long lists cut."""
    if isinstance(value, str):
        return value if value else "(empty)"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        shown = ", ".join(_readable(item, limit) for item in value[:limit])
        return f"[{shown}{', ...' if len(value) > limit else ''}]" + (f" ({len(value)} values)" if len(value) > limit else "")
    return str(value)


def jsonable(array: "np.ndarray") -> Any:
    """A NumPy output as JSON-able lists: bytes decoded as UTF-8, floats rounded to 6 digits."""
    import numpy as np

    array = np.asarray(array)
    if array.dtype == object or array.dtype.kind == "S":
        return np.vectorize(lambda b: b.decode("utf-8", "replace") if isinstance(b, bytes) else str(b),
                            otypes=[object])(array).tolist()
    if array.dtype.kind == "f":
        return np.round(array.astype("float64"), 6).tolist()
    return array.tolist()


class PipelineRegistry:
    """Maps pipeline names to classes from the ``seqapps.pipelines`` entry points, importing lazily."""

    def __init__(self) -> None:
        self._targets: dict[str, str] = {}
        self._classes: dict[str, type[Pipeline]] = {}
        self._loaded = False

    def declare(self, name: str, target: str) -> None:
        """Declares a pipeline by ``"module:Class"`` without importing it (tests and plugins)."""
        if name in self._targets and self._targets[name] != target:
            raise ValueError(f"pipeline {name!r} is declared twice: {self._targets[name]} and {target}")
        self._targets[name] = target

    def names(self) -> list[str]:
        """Returns the sorted names of all registered pipelines."""
        self._load_entry_points()
        return sorted(self._targets)

    def summary(self, name: str) -> str:
        """Returns the first line of the pipeline class's docstring, read without importing it."""
        classes = self._class_nodes(name)
        docstring = ast.get_docstring(classes[0]) if classes else None
        return docstring.strip().splitlines()[0] if docstring else ""

    def predict_input(self, name: str) -> str:
        """Returns what ``seqapps predict`` takes as INPUT for this pipeline, read without importing it.

        It is the class's (or a base class's, in the same module) ``predict_input``
        string, else ``Pipeline.predict_input``.
        """
        for node in self._class_nodes(name):
            for statement in node.body:
                targets = statement.targets if isinstance(statement, ast.Assign) else [
                    statement.target] if isinstance(statement, ast.AnnAssign) else []
                if (any(isinstance(t, ast.Name) and t.id == "predict_input" for t in targets)
                        and isinstance(statement.value, ast.Constant)):
                    return str(statement.value.value)
        return Pipeline.predict_input

    def config_outline(self, name: str) -> ConfigOutline | None:
        """Returns the pipeline's config class name, fields and presets, read without importing the pipeline.

        The config class is the ``Config = ...`` of the pipeline class (or a base); its
        fields and ``PRESETS`` keys are read from its source and its bases' sources,
        following ``from module import Base``. None when the source does not say them
        plainly (then the checks happen once the pipeline is imported).
        """
        self._load_entry_points()
        module_name = self._targets[name].partition(":")[0]
        for node in self._class_nodes(name):
            for statement in node.body:
                if (isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Name)
                        and any(isinstance(t, ast.Name) and t.id == "Config" for t in statement.targets)):
                    return _config_outline(module_name, statement.value.id)
        return None

    def _class_nodes(self, name: str) -> list[ast.ClassDef]:
        """The pipeline's class definition and its bases defined in the same module, from the source."""
        self._load_entry_points()
        module_name, _, class_name = self._targets[name].partition(":")
        tree = _module_tree(module_name)
        return [] if tree is None else _class_chain(tree, class_name)

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
            cls = getattr(importlib.import_module(module_name), class_name)
            if not (isinstance(cls, type) and issubclass(cls, Pipeline)):
                raise TypeError(f"pipeline {name!r} must be a subclass of seqapps.pipeline.Pipeline, got {cls!r}")
            cls.name = name
            self._classes[name] = cls
        return self._classes[name]

    def _load_entry_points(self) -> None:
        """Reads the entry points once; one whose module is not installed is left out."""
        if self._loaded:
            return
        self._loaded = True
        for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if importlib.util.find_spec(entry.module) is not None:
                self.declare(entry.name, entry.value)


@dataclasses.dataclass(frozen=True)
class ConfigOutline:
    """What the command line checks before importing a pipeline (and TensorFlow).

    Attributes:
        class_name: the config dataclass's name.
        fields: its field names.
        presets: its preset names.
    """

    class_name: str
    fields: frozenset[str]
    presets: tuple[str, ...]


def _module_tree(module_name: str) -> ast.Module | None:
    """The parsed source of a module, found without importing it; None without a ``.py`` source."""
    spec = importlib.util.find_spec(module_name)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    with open(spec.origin, encoding="utf-8") as source:
        return ast.parse(source.read())


def _class_chain(tree: ast.Module, class_name: str) -> list[ast.ClassDef]:
    """The class ``class_name`` of a module and its bases defined in that module, the class first."""
    defined = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    chain, pending = [], [class_name]
    while pending:
        node = defined.get(pending.pop(0))
        if node is not None and node not in chain:
            chain.append(node)
            pending.extend(base.id for base in node.bases if isinstance(base, ast.Name))
    return chain


def _config_outline(module_name: str, class_name: str) -> ConfigOutline | None:
    """Reads a config dataclass's fields and preset names from its module's source and its bases'."""
    tree = _module_tree(module_name)
    chain = [] if tree is None else _class_chain(tree, class_name)
    if not chain:
        return None
    fields: set[str] = set()
    presets: tuple[str, ...] | None = None
    local = {node.name for node in chain}
    for node in chain:
        for statement in node.body:
            target = statement.target if isinstance(statement, ast.AnnAssign) else (
                statement.targets[0] if isinstance(statement, ast.Assign) and len(statement.targets) == 1 else None)
            if not isinstance(target, ast.Name):
                continue
            if target.id == "PRESETS":
                if presets is None:  # the class nearest to the config's own wins, as in Python
                    if not isinstance(statement.value, ast.Dict) or not all(
                            isinstance(k, ast.Constant) for k in statement.value.keys):
                        return None
                    presets = tuple(k.value for k in statement.value.keys)
            elif isinstance(statement, ast.AnnAssign) and "ClassVar" not in ast.unparse(statement.annotation):
                fields.add(target.id)
    imported = {alias.asname or alias.name: statement.module for statement in tree.body
                if isinstance(statement, ast.ImportFrom) and statement.module and statement.level == 0
                for alias in statement.names}
    for node in chain:
        for base in node.bases:
            if not isinstance(base, ast.Name) or base.id in local:
                continue
            if base.id not in imported:
                return None
            outline = _config_outline(imported[base.id], base.id)
            if outline is None:
                return None
            fields |= outline.fields
            presets = outline.presets if presets is None else presets
    return None if presets is None else ConfigOutline(class_name, frozenset(fields), presets)


REGISTRY = PipelineRegistry()
