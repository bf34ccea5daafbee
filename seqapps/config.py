"""Dataclass configs with presets, YAML files and ``--set key=value`` overrides.

Precedence (lowest first): dataclass defaults, the preset, ``--config file.yaml``,
then each ``--set key=value``. The result is type-checked field by field and then
validated by the config's own ``validate()``; the resolved config is saved beside
every export so that a run can be repeated or fine-tuned.
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, ClassVar, Collection, Union

import yaml

from seqapps.errors import ConfigError
from seqapps.layers import bnce_options, hrnn_modes

PRESETS = ("tiny", "default", "full")
HRNN_CELLS = ("lstm", "gru")
#: Choices of ``TrainingConfig.lr_schedule``.
LR_SCHEDULES = ("plateau", "budget")
#: Choices of ``Seq2SeqConfig``, as ``seqapps.layers.attention_decoder`` and ``BatchNCE`` name them.
SEQ2SEQ_CELLS = ("lstm", "gru")
SEQ2SEQ_ATTENTIONS = ("bahdanau", "luong", "none")
SEQ2SEQ_OUTPUTS = ("softmax", "bnce")


@dataclasses.dataclass
class TrainingConfig:
    """Settings every pipeline shares; pipeline configs subclass it.

    Attributes:
        epochs: maximum number of epochs (early stopping may end sooner).
        batch_size: global batch size (split across replicas under tf.distribute).
        learning_rate: initial learning rate (see ``lr_schedule``).
        optimizer: "adam" or "sgd".
        clipnorm: global gradient-norm clipping threshold (0 disables it).
        early_stopping_patience: epochs without validation improvement before stopping.
        lr_schedule: "plateau" (the learning rate is halved after ``lr_patience`` epochs without validation
            improvement, down to 1/64 of it) or "budget" (it falls linearly with the time spent, from
            ``learning_rate`` to 1/64 of it at ``max_train_minutes``: the linear decay that Li, Yumer and
            Ramanan (ICLR 2020) found best under a training budget; without a budget, "plateau").
        lr_patience: epochs without validation improvement before halving the learning rate ("plateau").
        steps_per_epoch: cap on training steps per epoch (None: one pass over the data).
        max_train_minutes: a wall-clock budget for training (None: none): training stops at
            the first step that ends past it, and the epoch it cuts short is validated as
            usual; a resumed run's clock starts again at the resume.
        seed: seed for Python, NumPy and TensorFlow.
        length_sorted_batches: for elements of varying length: sort each window of this many shuffled
            batches' elements by length before batching, so that a batch holds elements of similar length
            and pads less (``seqapps.training.length_grouped_batches``); 0 or 1: batches as shuffled.
    """

    epochs: int = 20
    batch_size: int = 64
    learning_rate: float = 1e-3
    optimizer: str = "adam"
    clipnorm: float = 5.0
    early_stopping_patience: int = 5
    lr_schedule: str = "plateau"
    lr_patience: int = 2
    steps_per_epoch: int | None = None
    max_train_minutes: float | None = None
    seed: int = 42
    length_sorted_batches: int = 0

    #: preset name -> field overrides; "default" is usually empty.
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {"tiny": {}, "default": {}, "full": {}}

    def validate(self) -> None:
        """Raises ConfigError when a value is out of range. Subclasses extend it."""
        require(self.epochs >= 1, "epochs", self.epochs, "an integer >= 1")
        require(self.batch_size >= 1, "batch_size", self.batch_size, "an integer >= 1")
        require(self.learning_rate > 0, "learning_rate", self.learning_rate, "a number > 0")
        require(self.optimizer in ("adam", "sgd"), "optimizer", self.optimizer, "one of adam, sgd")
        require(self.clipnorm >= 0, "clipnorm", self.clipnorm, "a number >= 0")
        require(self.steps_per_epoch is None or self.steps_per_epoch >= 1,
                 "steps_per_epoch", self.steps_per_epoch, "null or an integer >= 1")
        require(self.max_train_minutes is None or self.max_train_minutes > 0,
                "max_train_minutes", self.max_train_minutes, "null or a number > 0")
        require(self.lr_schedule in LR_SCHEDULES, "lr_schedule", self.lr_schedule, f"one of {', '.join(LR_SCHEDULES)}")
        require(self.length_sorted_batches >= 0, "length_sorted_batches", self.length_sorted_batches,
                "an integer >= 0")

    def to_dict(self) -> dict[str, Any]:
        """Returns the fields as plain YAML/JSON-able values."""
        return dataclasses.asdict(self)


@dataclasses.dataclass
class HRNNConfig(TrainingConfig):
    """Settings of the hierarchy shared by the HRNN pipelines.

    Attributes:
        mode: "decoupled" (restricted gradients + local decoder losses), "hrnn" (true
            gradients), "gr_hrnn" (restricted, no decoders) or "mr_hrnn" (true gradients
            truncated to the memory of ``decoupled``).
        cell: "lstm" or "gru".
        units: units per level, lowest first; its length is the number of levels.
        periods: ticks of each level per tick of the level above (an int for all, or one per
            upper level); with word boundaries, the longest span a decoder is asked about.
        beta: decoder loss weight, >= 0 (a number, or one per upper level; 0 switches a
            level's decoder off). None: 1 for "decoupled", 0 otherwise; "hrnn" takes any
            (the paper's hrnn baseline with decoders), "gr_hrnn" and "mr_hrnn" only 0.
        aux_hidden_units: width of each decoder's hidden layer.
    """

    mode: str = "decoupled"
    cell: str = "lstm"
    units: list[int] = dataclasses.field(default_factory=lambda: [64, 64])
    periods: int | list[int] = 10
    beta: float | list[float] | None = None
    aux_hidden_units: int = 64

    def validate(self) -> None:
        super().validate()
        require(self.mode in hrnn_modes.MODES, "mode", self.mode, f"one of {', '.join(hrnn_modes.MODES)}")
        require(self.cell in HRNN_CELLS, "cell", self.cell, f"one of {', '.join(HRNN_CELLS)}")
        require(len(self.units) >= 2 and min(self.units) >= 1, "units", self.units,
                "a list of at least two integers >= 1 (one per level)")
        uppers = len(self.units) - 1
        require(len(self.period_list()) == uppers and min(self.period_list()) >= 1, "periods", self.periods,
                f"an integer >= 1 or {uppers} of them (one per upper level)")
        betas = self.beta if isinstance(self.beta, list) else [0.0 if self.beta is None else self.beta]
        require(len(betas) in (1, uppers) and min(betas) >= 0, "beta", self.beta,
                f"a number >= 0 or {uppers} of them (one per upper level)")
        require(self.mode not in ("gr_hrnn", "mr_hrnn") or max(betas) == 0, "beta", self.beta,
                f"0 with mode={self.mode} (it has no decoders; mode=decoupled or hrnn has them)")
        require(self.aux_hidden_units >= 1, "aux_hidden_units", self.aux_hidden_units, "an integer >= 1")

    def period_list(self) -> list[int]:
        """Returns ``periods`` as one int per upper level."""
        if isinstance(self.periods, list):
            return list(self.periods)
        return [self.periods] * (len(self.units) - 1)


@dataclasses.dataclass
class Seq2SeqConfig(TrainingConfig):
    """Settings of the attending decoder and its generator, shared by the encoder-decoder pipelines.

    A pipeline config subclasses it, may give the fields other defaults, and narrows a choice by
    overriding ``CHOICES`` (translation's lexicon needs attention, so it has no ``"none"``).

    Attributes:
        cell: "lstm" or "gru".
        embedding_dim: the target word embedding size.
        units: decoder units (``seqapps.layers.attention_decoder.AttentionDecoder``).
        attention: "bahdanau" (additive), "luong" (dot product) or "none".
        dropout: dropout on the embeddings and the attentional hidden state.
        output: "softmax" or "bnce" (the output layer's training criterion; evaluation and serving
            use the full softmax).
        log_z: the fixed log normaliser of B-NCE.
        extra_noise: extra unigram noise words per batch for B-NCE.
        noise_scope: B-NCE's batch: "time_step" (the paper's form: the B targets of one decoder step are
            each other's noise) or "batch" (every real target token of the batch, at every step, is every
            other's noise: K = the batch's target tokens - 1). Padding is never noise.
        beam_size: hypotheses kept by the ``beam`` signature and the beam evaluation.
        length_penalty: alpha of the GNMT length penalty of beam search.
        timing_steps: training steps timed on a fresh copy of the model after training, for
            ``train_tokens_per_s`` (target words and end tokens, not padding, per second; 0: not measured).
    """

    cell: str = "lstm"
    embedding_dim: int = 64
    units: int = 128
    attention: str = "bahdanau"
    dropout: float = 0.1
    output: str = "softmax"
    log_z: float = 5.0
    extra_noise: int = 0
    noise_scope: str = "time_step"
    beam_size: int = 3
    length_penalty: float = 0.6
    timing_steps: int = 10

    #: field -> its allowed values
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "cell": SEQ2SEQ_CELLS, "attention": SEQ2SEQ_ATTENTIONS, "output": SEQ2SEQ_OUTPUTS,
        "noise_scope": bnce_options.NOISE_SCOPES}

    def validate(self) -> None:
        super().validate()
        for name, choices in self.CHOICES.items():
            require(getattr(self, name) in choices, name, getattr(self, name), f"one of {', '.join(choices)}")
        for name in ("embedding_dim", "units", "beam_size"):
            require(getattr(self, name) >= 1, name, getattr(self, name), "an integer >= 1")
        require(0 <= self.dropout < 1, "dropout", self.dropout, "a number in [0, 1)")
        require(self.timing_steps >= 0, "timing_steps", self.timing_steps, "an integer >= 0")
        require(self.extra_noise >= 0, "extra_noise", self.extra_noise, "an integer >= 0")
        require(self.length_penalty >= 0, "length_penalty", self.length_penalty, "a number >= 0")


def require(condition: bool, field: str, value: Any, expected: str) -> None:
    """Raises ConfigError naming the field and value unless ``condition`` holds."""
    if not condition:
        raise ConfigError(f"config field {field!r}: got {value!r}, expected {expected}")


def require_split_fractions(val_fraction: float, test_fraction: float) -> None:
    """Raises ConfigError unless both shares are > 0 and they sum below 1 (``seqapps.data.splits``)."""
    require(0 < val_fraction and 0 < test_fraction and val_fraction + test_fraction < 1, "val_fraction/test_fraction",
            (val_fraction, test_fraction), "shares > 0 summing below 1")


def resolve_config(
    config_class: type[TrainingConfig],
    preset: str = "default",
    config_file: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    base: dict[str, Any] | None = None,
) -> TrainingConfig:
    """Builds a validated config from defaults, preset, YAML file and overrides.

    Args:
        config_class: the pipeline's config dataclass.
        preset: one of ``PRESETS``.
        config_file: optional YAML mapping of field -> value.
        overrides: ``"key=value"`` strings; values are parsed as YAML scalars or lists.
        base: values laid over the defaults and preset (finetune starts from an export's saved
            config; a field the export predates takes the preset's value, then the default).

    Returns:
        An instance of ``config_class``.

    Raises:
        ConfigError: unknown preset or key, a value of the wrong type, or out of range.
    """
    _check_preset(preset, config_class.PRESETS)
    fields = [f.name for f in dataclasses.fields(config_class)]
    values: dict[str, Any] = {}
    layers = [(f"preset {preset!r}", config_class.PRESETS[preset])] + ([("saved config", base)] if base else [])
    for source, layer in layers + _user_layers(config_file, overrides):
        for key, value in layer.items():
            _check_field(key, fields, source, config_class.__name__)
            values[key] = value
    hints = typing.get_type_hints(config_class)
    coerced = {key: _coerce(key, value, hints[key]) for key, value in values.items()}
    config = config_class(**coerced)
    config.validate()
    return config


def check_names(class_name: str, fields: Collection[str], presets: Collection[str], preset: str | None,
                config_file: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> None:
    """Checks a run's preset and field names before its config class (and TensorFlow) is imported.

    ``resolve_config`` makes the same checks, with the same messages, on the class itself.

    Args:
        class_name: the config class's name (for the messages).
        fields, presets: its field and preset names.
        preset: the preset asked for (None: not checked, as in finetune).
        config_file, overrides: as for ``resolve_config``.

    Raises:
        ConfigError: an unknown preset or field, or an unreadable config file.
    """
    if preset is not None:
        _check_preset(preset, presets)
    for source, layer in _user_layers(config_file, overrides):
        for key in layer:
            _check_field(key, fields, source, class_name)


def _check_preset(preset: str, presets: Collection[str]) -> None:
    if preset not in presets:
        raise ConfigError(f"unknown preset {preset!r}; choose one of {', '.join(presets)}")


def _check_field(key: str, fields: Collection[str], source: str, class_name: str) -> None:
    if key not in fields:
        close = difflib.get_close_matches(key, sorted(fields), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"{source}: unknown config field {key!r} for {class_name}{hint}")


def _user_layers(config_file: str | Path | None, overrides: list[str] | tuple[str, ...]
                 ) -> list[tuple[str, dict[str, Any]]]:
    """The user's ``(source, fields)`` layers: the YAML file, then ``--set``."""
    layers = [(str(config_file), _read_yaml_mapping(Path(config_file)))] if config_file is not None else []
    return layers + [("--set", _parse_overrides(overrides))]


def _read_yaml_mapping(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: not valid YAML ({error.__class__.__name__})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping of config fields, got {type(loaded).__name__}")
    return loaded


def _parse_overrides(overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected key=value")
        try:
            parsed[key.strip()] = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            parsed[key.strip()] = raw
    return parsed


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    """Checks ``value`` against a field's type, converting strings and scalars where safe."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        for option in (o for o in options if o is not type(None)):
            try:
                return _coerce(key, value, option)
            except ConfigError:
                continue
        raise ConfigError(f"config field {key!r}: got {value!r}, expected {_type_name(annotation)}")
    if origin is list:
        (item_type,) = typing.get_args(annotation)
        if isinstance(value, str):
            value = [yaml.safe_load(part) for part in value.split(",") if part.strip()]  # "64,64" -> [64, 64]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config field {key!r}: got {value!r}, expected a list")
        return [_coerce(key, item, item_type) for item in value]
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no"):
            return value.lower() in ("true", "yes")
    elif annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "3e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif annotation is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    raise ConfigError(f"config field {key!r}: got {value!r}, expected {_type_name(annotation)}")


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false"}.get(
            annotation.__name__, annotation.__name__)
    return str(annotation).replace("typing.", "")


def dump_config(config: TrainingConfig, pipeline: str, preset: str) -> str:
    """Returns the YAML text saved beside an export."""
    return yaml.safe_dump({"pipeline": pipeline, "preset": preset, "config": config.to_dict()}, sort_keys=False)
