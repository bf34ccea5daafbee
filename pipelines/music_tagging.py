"""Music auto-tagging: a convolutional-recurrent network (CRNN, Choi et al. 2017) from waveform to tag names.

Model: log-mel features computed in the graph (``seqapps.layers.spectrogram.LogMelSpectrogram``)
over a fixed-length window, standardised per mel band with the train split's statistics
(a ``Normalization`` layer, saved with the model), SpecAugment-style time and band masks
while training (``SpecAugment``), 2D convolution blocks (convolution, batch normalisation,
ReLU, 2x2 max pooling), stacked (optionally bidirectional) GRU or LSTM layers over time
(``--set rnn=hrnn``: a ``DecoupledHRNN``; ``rnn=bihrnn``: one each way, concatenated), pooled over
time (mean and max, or the last step), optionally beside the mean and deviation of each band
(``clip_statistics``), and one sigmoid per tag, trained with binary cross-entropy
(``class_alpha`` > 0: class-balanced, positives weighted by ``class_alpha`` and negatives by ``1 - class_alpha``).
A track is cut into non-overlapping windows, the last one ending at the track's end (a
track shorter than one window is zero-padded); its scores are the windows' scores
aggregated by ``mean`` or ``max``. Training windows may overlap (``train_hop_seconds``).

Data: without ``--data``, pieces of the music21 corpus (Bach chorales, Palestrina,
Monteverdi, the reels, jigs and hornpipes of Ryan's Mammoth Collection and of O'Neill's
Music of Ireland; no Essen) rendered by FluidSynth or pretty_midi (``seqapps.data.music``;
``renderer`` is recorded in the report), each rendering with its own instrument, tempo,
transposition, velocity curve, reverb and chorus. FluidSynth renders the training and
validation clips with the ``soundfonts`` in turn (default TimGM6mb and FluidR3), and the
test pieces twice: with those (the ``test`` split) and with ``held_out_soundfont`` (default
Csound's sf_GMbank, the ``held_out`` split), which training never hears. ``--data folder/``
reads ``folder/tags.csv`` (``path,tags``, tags separated by ``;`` or ``|``) or one
sub-folder per tag; ``val_fraction``/``test_fraction`` of the clips (seeded) are held out.
Fine-tuning on new tag names extends the output layer (``adapt_model``): the old tags keep
their weights and order, the new ones (from the training clips, most frequent first) start
fresh. With ``tags=replace`` the output layer has exactly the training clips' tags, in
sorted order: a tag the export also has keeps its unit's weights, the others start fresh,
and the export's other tags are dropped. Thresholds are calibrated on the validation clips
either way. A validation or test clip's tag that training never saw is ignored in scoring
(the report counts such clips).

Metrics: macro and micro ROC-AUC and PR-AUC, the ROC-AUC of each tag and its mean per tag
group (``genre``, ``mode``, ... of ``group:value`` tags) on the test clips, and the same as
``held_out/...`` on the held-out soundfont's clips, beside two
baselines, tag priors (training frequencies) and a logistic regression on clip-averaged
MFCCs; precision and recall at per-tag F1-optimal thresholds chosen on the validation
clips (stored in the export).

Report: ROC curves of the test clips per tag group (from the export's scores, one curve per tag),
the ``taggram`` signature's window scores with tag names and times for a few test clips, and each
tag's ROC-AUC beside the MFCC baseline's.

Export (waveforms at 16 kHz):
- ``serving_default``: ``waveform`` float32 [batch, samples] -> ``scores`` float32
  [batch, n_tags] (tag order of the state), ``tags`` string [batch, n_tags] (best first),
  ``detected`` bool [batch, n_tags] (score >= the tag's threshold).
- ``wav_bytes``: ``wav`` string [batch] (WAV: PCM of 8 to 32 bits or float, 1 to 384 kHz, resampled
  in-graph; ``audio.decode_wav``) -> the same.
- ``taggram``: ``waveform`` -> ``window_scores`` float32 [batch, windows, n_tags] (tag order of the
  state), ``tags`` string [batch, n_tags] (that order), ``window_start`` and ``window_end`` float32
  [batch, windows] seconds (the same for every row of a zero-padded batch).
- ``classify``: TF Serving's classification API over ``wav_bytes``: serialized ``tf.train.Example``s
  (``inputs``), each with the WAV file as the bytes feature ``wav``, -> ``classes`` string [batch, n_tags]
  and ``scores`` float32 [batch, n_tags], best first.
A waveform with NaN or Inf, empty, or longer than ``max_seconds`` is rejected
(InvalidArgument); samples beyond full scale are clipped to [-1, 1] (``audio.bounded``); silence is valid (its scores are what the model gives floor-level features).
"""
from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any, Sequence

import keras
import numpy as np
import tensorflow as tf

from seqapps.config import TrainingConfig, require, require_split_fractions
from seqapps.data import audio, music, samples
from seqapps.data import splits as split_rule
from seqapps.errors import DataError
from seqapps.export import ExportCalls, Limits, ServingModule, Signature, examples_signature, ranked_classes
from seqapps.export_format import CLASSIFY_METHOD
from seqapps.finetuning import VocabularyMap, grow_vocabulary, transfer_weights
from seqapps.layers.hierarchical_rnn import BidirectionalHRNN, DecoupledHRNN
from seqapps.layers.spectrogram import LogMelSpectrogram, SpecAugment, TimeStatistics
from seqapps.metrics import f1_thresholds, precision_recall_at, roc_curves, tag_groups, tagging_report
from seqapps.pipeline import SPLIT_COUNTS, VOCABULARIES, Headline, Pipeline, Splits, row_inputs
from seqapps.report import plots
from seqapps.report.document import Block, Figure, Section, Table, Text

SPLITS = ("train", "val", "test")
HELD_OUT = "held_out"  # the generated corpus's test pieces rendered with the held-out soundfont
AGGREGATES = ("mean", "max")
TAGGRAM_TOP = 3  # tags ``seqapps predict --signature taggram`` shows per window
REPORT_TAGGRAMS = 3  # test clips whose taggram the report draws
ROC_COLUMNS = 3  # panels per row of the report's ROC curves
PLAIN_TAGS = "tags"  # the ROC panel of tags outside any ``group:value`` group
CELLS = {"gru": keras.layers.GRU, "lstm": keras.layers.LSTM}
RNN_CELLS = {"gru": keras.layers.GRUCell, "lstm": keras.layers.LSTMCell}
RNNS = ("rnn", "hrnn", "bihrnn")
HRNN_RNNS = ("hrnn", "bihrnn")
POOLINGS = ("last", "meanmax")
TAG_CHOICES = ("extend", "replace")


@dataclasses.dataclass
class MusicTaggingConfig(TrainingConfig):
    """Music tagging settings.

    Attributes:
        collections: music21 collections of the generated corpus (``seqapps.data.music.COLLECTIONS``).
        pieces_per_collection: pieces taken from each collection.
        renderings: renderings of each piece (each with its own instrument and tempo).
        clip_seconds: length of every generated clip.
        renderer: "auto" (FluidSynth when its binary is installed), "synth" (pretty_midi) or "fluidsynth".
        soundfonts: FluidSynth's soundfonts of the train, val and test clips, in turn: file names under
            /usr/share/sounds/sf2 or sf3 (``seqapps.data.music.SOUNDFONT_PACKAGES`` names their packages) or paths.
        held_out_soundfont: the soundfont of the ``held_out`` test split (the test pieces rendered again), which
            no training clip uses; null: no such split.
        csv: the tag table inside the ``--data`` folder.
        val_fraction, test_fraction: shares of the pieces (generated) or rows (user) held out.
        tags: at fine-tuning, "extend" (the export's tags, then the training clips' new tags) or "replace" (the
            training clips' tags only; a tag the export also has keeps its output unit's weights).
        window_seconds: the model's window; tracks are cut into windows of this length (non-overlapping, the
            last one ending at the track's end; a track shorter than one window is zero-padded).
        train_hop_seconds: hop between the training windows (overlapping when < window_seconds: more, shifted
            crops of each clip); None: the window length.
        aggregate: "mean" or "max" of the window scores.
        max_seconds: the longest track accepted (training files and serving).
        n_mels, n_fft, hop_length: the log-mel front end (samples at 16 kHz).
        conv_filters: filters of each 2D convolution block.
        rnn: "rnn" (stacked GRU/LSTM layers) or "hrnn" (a ``DecoupledHRNN`` over the frames: one level per
            ``units`` entry, the upper ones ticking every ``hrnn_periods`` steps; the clip is read from the last
            step, whose lower state has just read the upper level's summary; ``bidirectional`` does not apply) or
            "bihrnn" (that HRNN and a copy reading the frames backwards, their outputs concatenated; "last" pooling
            takes the forward one's last step and the backward one's first).
        cell: "gru" or "lstm".
        units: units of each recurrent layer (per direction), or of each HRNN level.
        bidirectional: run each recurrent layer both ways.
        hrnn_periods, hrnn_mode: the HRNN's ticks and training mode (``DecoupledHRNN``).
        spec_masks, spec_max_frames, spec_max_bands: SpecAugment-style masking while training (``SpecAugment``):
            masks per axis (0: off), the widest time mask in frames and the widest band mask in mel bands.
        pooling: how the recurrent output sequence becomes one vector: "last" (its last step) or "meanmax"
            (its mean and maximum over time, concatenated).
        clip_statistics: also give the output layer the mean and standard deviation over the window of each
            standardised log-mel band (what the MFCC baseline summarises).
        dropout: before the output layer.
        class_alpha: 0 for plain binary cross-entropy, else the positives' weight in (0, 1).
    """

    collections: list[str] = dataclasses.field(default_factory=lambda: list(music.COLLECTIONS))
    pieces_per_collection: int = 60
    renderings: int = 2
    clip_seconds: float = 10.0
    renderer: str = "auto"
    soundfonts: list[str] = dataclasses.field(default_factory=lambda: list(music.TRAIN_SOUNDFONTS))
    held_out_soundfont: str | None = music.HELD_OUT_SOUNDFONT
    csv: str = "tags.csv"
    val_fraction: float = 0.15
    test_fraction: float = 0.2
    tags: str = "extend"
    window_seconds: float = 3.0
    train_hop_seconds: float | None = None
    aggregate: str = "mean"
    max_seconds: float = 600.0
    n_mels: int = 64
    n_fft: int = 512
    hop_length: int = 256
    conv_filters: list[int] = dataclasses.field(default_factory=lambda: [32, 32, 64])
    rnn: str = "rnn"
    cell: str = "gru"
    units: list[int] = dataclasses.field(default_factory=lambda: [64])
    bidirectional: bool = True
    hrnn_periods: int = 4
    hrnn_mode: str = "decoupled"
    spec_masks: int = 2
    spec_max_frames: int = 20
    spec_max_bands: int = 8
    pooling: str = "meanmax"
    clip_statistics: bool = False
    dropout: float = 0.2
    class_alpha: float = 0.0
    batch_size: int = 32
    epochs: int = 15

    PRESETS = {
        "tiny": {"pieces_per_collection": 2, "renderings": 1, "clip_seconds": 4.0, "renderer": "synth",
                 "window_seconds": 2.0, "n_mels": 32, "conv_filters": [8, 8], "units": [8], "epochs": 1,
                 "batch_size": 4},
        # 5 s windows cropped every second and a longer patience, chosen on validation (docs/results.md); 3 s
        # windows at a 3 s hop stopped after 7 epochs, undertrained
        "default": {"window_seconds": 5.0, "train_hop_seconds": 1.0, "epochs": 40, "early_stopping_patience": 8,
                    "lr_patience": 3},
        "full": {"pieces_per_collection": 300, "renderings": 3, "conv_filters": [64, 64, 128, 128],
                 "units": [128, 128], "window_seconds": 5.0, "train_hop_seconds": 1.0, "epochs": 40,
                 "early_stopping_patience": 8, "lr_patience": 3},
    }

    def validate(self) -> None:
        super().validate()
        unknown = [name for name in self.collections if name not in music.COLLECTIONS]
        require(bool(self.collections) and not unknown, "collections", self.collections,
                f"a list of {', '.join(music.COLLECTIONS)}")
        for name in ("pieces_per_collection", "renderings", "n_mels", "n_fft", "hop_length"):
            require(getattr(self, name) >= 1, name, getattr(self, name), "an integer >= 1")
        require(self.renderer in music.RENDERERS, "renderer", self.renderer, f"one of {', '.join(music.RENDERERS)}")
        require(bool(self.soundfonts) and all(isinstance(name, str) and name for name in self.soundfonts),
                "soundfonts", self.soundfonts, "a list of one or more soundfont file names or paths")
        require(self.held_out_soundfont not in self.soundfonts, "held_out_soundfont", self.held_out_soundfont,
                f"null or a soundfont that soundfonts ({', '.join(self.soundfonts)}) does not list")
        require_split_fractions(self.val_fraction, self.test_fraction)
        require(self.tags in TAG_CHOICES, "tags", self.tags, f"one of {', '.join(TAG_CHOICES)}")
        require(self.window_seconds > 0, "window_seconds", self.window_seconds, "a number > 0")
        require(self.clip_seconds >= self.window_seconds, "clip_seconds", self.clip_seconds,
                f"a number >= window_seconds ({self.window_seconds})")
        require(self.max_seconds >= self.window_seconds, "max_seconds", self.max_seconds, "a number >= window_seconds")
        require(self.train_hop_seconds is None or 0 < self.train_hop_seconds <= self.window_seconds,
                "train_hop_seconds", self.train_hop_seconds, "null or a number in (0, window_seconds]")
        for name in ("spec_masks", "spec_max_frames", "spec_max_bands"):
            require(getattr(self, name) >= 0, name, getattr(self, name), "an integer >= 0")
        require(self.pooling in POOLINGS, "pooling", self.pooling, f"one of {', '.join(POOLINGS)}")
        require(self.aggregate in AGGREGATES, "aggregate", self.aggregate, f"one of {', '.join(AGGREGATES)}")
        require(self.rnn in RNNS, "rnn", self.rnn, f"one of {', '.join(RNNS)}")
        require(self.rnn not in HRNN_RNNS or len(self.units) >= 2, "units", self.units,
                f"at least two integers (one per HRNN level) with rnn={self.rnn}")
        require(self.hrnn_periods >= 1, "hrnn_periods", self.hrnn_periods, "an integer >= 1")
        require(self.cell in CELLS, "cell", self.cell, f"one of {', '.join(CELLS)}")
        require(bool(self.units) and min(self.units) >= 1, "units", self.units, "a list of integers >= 1")
        require(min(self.conv_filters, default=1) >= 1, "conv_filters", self.conv_filters, "a list of integers >= 1")
        require(0 <= self.dropout < 1, "dropout", self.dropout, "a number in [0, 1)")
        require(0 <= self.class_alpha < 1, "class_alpha", self.class_alpha, "0 (off) or a number in (0, 1)")


# --- the MFCC baseline (scikit-learn, librosa) ----------------------------------------------------------------------


def clip_mfccs(clips: list[np.ndarray], sample_rate: int, n_mfcc: int = 20) -> np.ndarray:
    """Mean and standard deviation over time of each clip's MFCCs (``librosa.feature.mfcc``): [clips, 2 n_mfcc]."""
    import librosa

    features = [librosa.feature.mfcc(y=clip.astype(np.float32), sr=sample_rate, n_mfcc=n_mfcc) for clip in clips]
    return np.stack([np.concatenate([f.mean(axis=1), f.std(axis=1)]) for f in features])


def mfcc_logistic_scores(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray) -> np.ndarray:
    """Per-tag logistic regressions (standardised features); a tag with one class in training scores its prior.

    Args:
        train_x, test_x: features [clips, features].
        train_y: 0/1 [clips, tags].

    Returns:
        Probabilities [test clips, tags].
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    scores = np.tile(train_y.mean(axis=0), (len(test_x), 1))
    for tag in range(train_y.shape[1]):
        if 0 < train_y[:, tag].sum() < len(train_y):
            model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
            scores[:, tag] = model.fit(train_x, train_y[:, tag]).predict_proba(test_x)[:, 1]
    return scores


# --- graph helpers ---------------------------------------------------------------------------------------------------


def window_scores(model: keras.Model, waveform: tf.Tensor, window: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Scores [batch, windows, tags] of a batch's windows (``audio.cut_windows``), and the windows' start samples."""
    batch = tf.shape(waveform)[0]
    windows, starts = audio.cut_windows(waveform, window)
    scores = model(tf.reshape(windows, [-1, window]), training=False)
    return tf.reshape(scores, [batch, tf.shape(starts)[0], -1]), starts


def track_scores(model: keras.Model, waveform: tf.Tensor, window: int, aggregate: str) -> tf.Tensor:
    """Track scores [batch, tags]: the window scores aggregated by ``mean`` or ``max``."""
    scores = window_scores(model, waveform, window)[0]
    return tf.reduce_mean(scores, axis=1) if aggregate == "mean" else tf.reduce_max(scores, axis=1)


class MusicTagging(Pipeline):
    """Music auto-tagging: a convolutional-recurrent network over log-mel windows, sigmoid scores per tag."""

    Config = MusicTaggingConfig
    predict_input = "audio files (WAV, FLAC, OGG or MP3), one per row; --signature taggram: the best tags per window"

    # --- data -------------------------------------------------------------------------------

    headline_metrics = (Headline("roc_auc_macro", "ROC-AUC macro"), Headline("pr_auc_macro", "PR-AUC macro"),
                        Headline("roc_auc_micro", "ROC-AUC micro"), Headline("pr_auc_micro", "PR-AUC micro"),
                        Headline(f"{HELD_OUT}/roc_auc_macro", "held-out soundfont ROC-AUC macro", optional=True),
                        Headline(f"{HELD_OUT}/pr_auc_macro", "held-out soundfont PR-AUC macro", optional=True))

    def write_sample_data(self, folder: Path, seed: int = 0) -> tuple[str | None, list[str]]:
        """24 clips of plucked notes tagged bright/dark and lively/calm, tags the embedded corpus lacks."""
        _, clips = samples.write_tone_clips(folder / "clips", 24, music.SAMPLE_RATE, seconds=4.0, seed=seed)
        return str(folder / "clips"), [str(clips[0]), str(clips[1])]

    def load_data(self, config: MusicTaggingConfig, data_path: str | None,
                  state: dict[str, Any] | None = None) -> Splits:
        rate = music.SAMPLE_RATE
        if data_path:
            clips = music.read_tagged_folder(data_path, config.csv)
            splits = split_rule.split_groups([c.group for c in clips], config.val_fraction, config.test_fraction,
                                             str(data_path), "clips", seed=config.seed)
            parts = {split: [c for c, s in zip(clips, splits) if s == split] for split in SPLITS}
            source = {"source": str(data_path), "licence": "the user's", "renderer": None, "soundfonts": None}
        else:
            held_out = [config.held_out_soundfont] if config.held_out_soundfont else []
            renderer = music.resolve_renderer(config.renderer, [*config.soundfonts, *held_out])
            spec = music.CorpusSpec(list(config.collections), config.pieces_per_collection, config.renderings,
                                    config.clip_seconds, renderer, config.val_fraction, config.test_fraction,
                                    config.seed, list(config.soundfonts), config.held_out_soundfont)
            root = music.rendered_corpus(spec)
            generated = music.read_generated(root)
            parts = {split: [c for c in generated if c.split == split] for split in (*SPLITS, HELD_OUT)}
            if not all(parts[split] for split in SPLITS):
                raise DataError(f"{root}: a split has no clips; take more pieces_per_collection")
            source = {"source": f"music21 corpus rendered ({root})", "renderer": spec.renderer,
                      "soundfonts": {split: sorted({c.source for c in parts[split]}) for split in parts if parts[split]},
                      "licence": "; ".join(f"{name}: {music.COLLECTIONS[name].licence}" for name in spec.collections)}
        trained_tags = sorted({tag for clip in parts["train"] for tag in clip.tags})
        # the export's tags (a run's own), which ``adapt_model`` maps to the new ones
        arrays: dict[str, Any] = {"exported_tags": trained_tags if state is None else state["tags"]}
        if state is None:
            state = {"tags": trained_tags, "sample_rate": rate, "window_samples": int(config.window_seconds * rate),
                     "aggregate": config.aggregate, "max_seconds": config.max_seconds,
                     "thresholds": [0.5] * len(trained_tags)}
            added, removed = [], []
        else:  # fine-tuning: the training tags extend the exported ones (which keep their order) or replace them
            exported = state["tags"]
            tags = trained_tags if config.tags == "replace" else grow_vocabulary(
                exported, (tag for clip in parts["train"] for tag in clip.tags))
            added, removed = [t for t in tags if t not in exported], [t for t in exported if t not in tags]
            threshold = dict(zip(exported, state["thresholds"]))  # calibrated again on the validation clips
            state = {**state, "tags": tags, "thresholds": [threshold.get(tag, 0.5) for tag in tags]}
        index = {tag: i for i, tag in enumerate(state["tags"])}
        window = state["window_samples"]
        hop = int((config.train_hop_seconds or config.window_seconds) * rate)
        datasets = {}
        scored = [split for split in parts if split in SPLITS or parts[split]]  # an empty held_out split is left out
        for split in scored:  # held_out: arrays only, for evaluate
            waveforms, targets = [], np.zeros((len(parts[split]), len(index)), np.float32)
            for row, clip in enumerate(parts[split]):
                # a validation or test tag that training never saw has no output: it is ignored
                targets[row, [index[tag] for tag in clip.tags if tag in index]] = 1.0
                waveforms.append(audio.read_audio(clip.path, rate, config.max_seconds))
            arrays[split] = {"waveforms": waveforms, "targets": targets, "paths": [str(c.path) for c in parts[split]],
                             "sources": [c.source for c in parts[split]]}
            if split in SPLITS:
                datasets[split] = audio.window_dataset(waveforms, targets, window, hop if split == "train" else window)
        # held-out clips with a tag that training never saw: that tag is ignored in scoring them
        unseen = {split: sum(any(tag not in index for tag in clip.tags) for clip in parts[split])
                  for split in scored if split != "train"}
        report = {**source, "clips": {s: len(parts[s]) for s in scored}, "tags": len(index),
                  SPLIT_COUNTS: split_rule.split_counts("clips", {s: len(parts[s]) for s in SPLITS}),
                  "tag_counts": dict(zip(state["tags"], arrays["train"]["targets"].sum(axis=0).astype(int).tolist())),
                  VOCABULARIES: {"tags": {"added": added, "removed": removed, "size": len(index),
                                          "clips_with_unseen_tags": unseen}}}
        return Splits(datasets["train"], datasets["val"], datasets["test"], state=state, report=report, arrays=arrays)

    # --- model ------------------------------------------------------------------------------

    def build_model(self, config: MusicTaggingConfig, data: Splits) -> keras.Model:
        window = data.state["window_samples"]
        front_end = LogMelSpectrogram(sample_rate=data.state["sample_rate"], n_fft=config.n_fft,
                                      hop_length=config.hop_length, n_mels=config.n_mels, name="log_mel")
        inputs = keras.Input((window,), name="waveform")
        frames = front_end.compute_output_shape((None, window))[1]
        norm = keras.layers.Normalization(axis=-1, name="band_norm")  # per mel band, statistics of the train split
        norm.adapt(data.train.batch(64).map(lambda waveform, _: front_end(waveform)))
        bands = norm(front_end(inputs))
        if config.spec_masks:
            bands = SpecAugment(config.spec_masks, config.spec_max_frames, config.spec_max_bands, seed=config.seed,
                                name="spec_augment")(bands)
        x = keras.layers.Reshape((frames, config.n_mels, 1))(bands)
        for filters in config.conv_filters:
            x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
            x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
            x = keras.layers.MaxPooling2D((2, 2), padding="same")(x)
        x = keras.layers.Reshape((x.shape[1], x.shape[2] * x.shape[3]))(x)
        if config.rnn in HRNN_RNNS:
            hrnn = DecoupledHRNN([RNN_CELLS[config.cell](units) for units in config.units],
                                 periods=config.hrnn_periods, mode=config.hrnn_mode, allow_padding=True, name="hrnn")
            x = (hrnn if config.rnn == "hrnn" else BidirectionalHRNN(hrnn, name="bihrnn"))(x)
        layers = config.units if config.rnn == "rnn" else []
        for i, units in enumerate(layers):  # "last": the last layer returns its final state (both directions')
            layer = CELLS[config.cell](units, return_sequences=i < len(layers) - 1 or config.pooling == "meanmax")
            x = keras.layers.Bidirectional(layer)(x) if config.bidirectional else layer(x)
        if config.pooling == "meanmax":
            x = TimeStatistics(("mean", "max"), name="pooling")(x)
        elif config.rnn == "hrnn":
            x = x[:, -1, :]
        elif config.rnn == "bihrnn":  # each direction's state after reading the whole window
            half = x.shape[-1] // 2
            x = keras.layers.Concatenate()([x[:, -1, :half], x[:, 0, half:]])
        if config.clip_statistics:
            x = keras.layers.Concatenate()([x, TimeStatistics(("mean", "std"), name="band_statistics")(bands)])
        x = keras.layers.Dropout(config.dropout)(x)
        outputs = keras.layers.Dense(len(data.state["tags"]), activation="sigmoid", name="scores")(x)
        return keras.Model(inputs, outputs, name=self.name)

    def adapt_model(self, model: keras.Model, config: MusicTaggingConfig, data: Splits) -> keras.Model:
        """Fits the output layer to the fine-tuning tags: every layer keeps its weights, a tag the export has
        keeps its unit's (wherever ``tags=replace`` moves it), a new tag's unit starts fresh, and a dropped tag's
        unit goes."""
        exported, tags = data.arrays["exported_tags"], data.state["tags"]
        if exported == tags:
            return model
        grown = self.build_model(config, data)
        transfer_weights(model, grown, {"scores": VocabularyMap.from_tokens(exported, tags)})
        return grown

    def compile_args(self, config: MusicTaggingConfig, data: Splits) -> dict[str, Any]:
        if config.class_alpha > 0:
            loss = keras.losses.BinaryFocalCrossentropy(apply_class_balancing=True, alpha=config.class_alpha,
                                                        gamma=0.0)  # gamma 0: class-weighted cross-entropy
        else:
            loss = keras.losses.BinaryCrossentropy()
        return {"loss": loss, "metrics": [keras.metrics.AUC(multi_label=True, name="auc")]}

    # --- evaluation -------------------------------------------------------------------------

    def clip_scores(self, model: keras.Model, waveforms: list[np.ndarray], state: dict[str, Any]) -> np.ndarray:
        """Track-level scores [clips, tags] of each waveform alone (no padding shared between clips)."""
        score = tf.function(lambda w: track_scores(model, w, state["window_samples"], state["aggregate"]),
                            input_signature=[tf.TensorSpec([1, None], tf.float32)])  # one trace for every length
        return np.concatenate([score(tf.constant(w[None, :])).numpy() for w in waveforms])

    def calibrate(self, model: keras.Model, config: MusicTaggingConfig, data: Splits) -> dict[str, Any]:
        """Chooses each tag's F1-optimal threshold on the validation clips (``seqapps.metrics.f1_thresholds``).

        Args:
            model: the trained model.
            config: the resolved config.
            data: the splits; the thresholds follow the tag order of ``data.state``.

        Returns:
            ``{"thresholds": [one per tag]}``: the export's ``detected`` output and ``predict`` decide by them.
        """
        val = data.arrays["val"]
        scores = self.clip_scores(model, val["waveforms"], data.state)
        return {"thresholds": f1_thresholds(val["targets"], scores).tolist()}

    def evaluate(self, model: keras.Model, config: MusicTaggingConfig,
                 data: Splits) -> tuple[dict[str, float], dict[str, Any]]:
        """The test clips' ROC-AUC and PR-AUC beside the baselines', and precision and recall at the thresholds;
        the held-out soundfont's clips' ROC-AUC and PR-AUC as ``held_out/...`` beside the baselines' (when the corpus
        has them).

        Args:
            model: the trained model.
            config: the resolved config.
            data: the splits, their state calibrated (``calibrate``'s thresholds).

        Returns:
            ``(metrics, baselines)``: ``seqapps.metrics.tagging_report`` plus ``precision_recall_at`` of the
            model, and the tagging report of the tag priors and of the MFCC logistic regression (one regression
            fitted on the train clips scores both test splits).
        """
        tags, rate = data.state["tags"], data.state["sample_rate"]
        train = data.arrays["train"]
        scored = {split: data.arrays[split] for split in ("test", HELD_OUT) if split in data.arrays}
        scores = {split: self.clip_scores(model, arrays["waveforms"], data.state) for split, arrays in scored.items()}
        features = {split: clip_mfccs(arrays["waveforms"], rate) for split, arrays in scored.items()}
        mfcc = mfcc_logistic_scores(clip_mfccs(train["waveforms"], rate), train["targets"],
                                    np.concatenate(list(features.values())))
        metrics: dict[str, Any] = {}
        baselines: dict[str, dict[str, Any]] = {"tag_priors": {}, "mfcc_logistic_regression": {}}
        first = 0
        for split, arrays in scored.items():
            prefix, targets, count = "" if split == "test" else f"{split}/", arrays["targets"], len(arrays["targets"])
            priors = np.tile(train["targets"].mean(axis=0), (count, 1))
            for name, report in (("model", tagging_report(targets, scores[split], tags)),
                                 ("tag_priors", tagging_report(targets, priors, tags)),
                                 ("mfcc_logistic_regression", tagging_report(targets, mfcc[first:first + count], tags))):
                (metrics if name == "model" else baselines[name]).update(
                    {f"{prefix}{key}": value for key, value in report.items()})
            first += count
        metrics.update(precision_recall_at(scored["test"]["targets"], scores["test"],
                                           np.array(data.state["thresholds"], np.float32)))
        return metrics, baselines

    # --- export and prediction --------------------------------------------------------------

    def serving_module(self, model: keras.Model, config: MusicTaggingConfig, data: Splits) -> ServingModule:
        """The signatures (``serving_default``, ``wav_bytes``, ``taggram``, ``classify``) of the module docstring.

        Args:
            model: the trained model.
            config: the resolved config.
            data: the splits, their state calibrated: the tag names and thresholds are graph constants.

        Returns:
            The module; it needs no lookup table (the tag names are a constant of each signature).
        """
        state = data.state
        rate, window, aggregate = int(state["sample_rate"]), int(state["window_samples"]), state["aggregate"]
        max_samples = int(state["max_seconds"] * rate)
        names = tf.constant(state["tags"])
        thresholds = tf.constant(state["thresholds"], tf.float32)
        spec = {"waveform": tf.TensorSpec([None, None], tf.float32, name="waveform")}
        first = data.arrays["test"]["waveforms"][:2]
        example = {"waveform": audio.signature_rows(first, rate, wav=False)["waveform"]}

        def checked(raw: dict[str, tf.Tensor]) -> tf.Tensor:
            waveform = audio.bounded(raw["waveform"])
            samples = tf.shape(waveform)[1]
            checks = [tf.debugging.assert_less_equal(samples, max_samples, message=(
                          f"a waveform is longer than max_seconds ({max_samples} samples at {rate} Hz); cut it")),
                      tf.debugging.assert_greater(samples, 0, message="a waveform has no samples")]
            with tf.control_dependencies(checks):
                return tf.identity(waveform)

        def from_wav(raw: dict[str, tf.Tensor]) -> tf.Tensor:
            return audio.decode_wav(raw["wav"], rate, max_samples=max_samples)[0]

        def tagged(waveform: tf.Tensor) -> dict[str, tf.Tensor]:
            scores = track_scores(model, waveform, window, aggregate)
            order = tf.argsort(scores, axis=1, direction="DESCENDING", stable=True)
            return {"scores": scores, "tags": tf.gather(names, order), "detected": scores >= thresholds[None, :]}

        def taggram(waveform: tf.Tensor) -> dict[str, tf.Tensor]:
            scores, starts = window_scores(model, waveform, window)
            rows, samples = tf.shape(waveform)[0], tf.shape(waveform)[1]
            ends = tf.minimum(starts + window, samples)  # a track shorter than a window ends before it
            per_row = [rows, 1]  # every output keeps the leading batch dimension
            return {"window_scores": scores, "tags": tf.tile(names[None, :], per_row),
                    "window_start": tf.tile(tf.cast(starts, tf.float32)[None, :] / rate, per_row),
                    "window_end": tf.tile(tf.cast(ends, tf.float32)[None, :] / rate, per_row)}

        wav_example = {"wav": np.array([audio.wav_bytes(w, rate) for w in first], dtype=object)}
        wav = Signature({"wav": tf.TensorSpec([None], tf.string, name="wav")}, wav_example, tagged, from_wav)
        return ServingModule(model, {
            "serving_default": Signature(spec, example, tagged, checked),
            "wav_bytes": wav,
            "taggram": Signature(spec, example, taggram, checked),
            "classify": examples_signature(wav, CLASSIFY_METHOD,
                                           lambda outputs: ranked_classes(names, outputs["scores"]))})

    # --- report -----------------------------------------------------------------------------

    def report_data(self, model: keras.Model, config: MusicTaggingConfig, data: Splits,
                    export: ExportCalls) -> dict[str, np.ndarray]:
        """The test clips' scores (``serving_default``) and a few clips' taggrams (``taggram``), clip by clip.

        Each clip is sent alone, as ``seqapps predict`` sends one file, so its scores are those
        ``evaluate`` measured (no zero padding shared with a longer clip).

        Returns:
            ``tags`` (the state's order), ``scores`` and ``targets`` [test clips, tags] (the test split
            is small), and per drawn clip ``i``: ``taggram/i`` [windows, tags] (the tags of the
            signature's ``tags`` output, ``taggram_tags``), ``window_start/i`` and ``window_end/i``
            [windows] seconds, and ``clip/i`` (its file name).
        """
        test = data.arrays["test"]
        scores = [export("serving_default", {"waveform": w[None, :]})["scores"][0] for w in test["waveforms"]]
        arrays: dict[str, np.ndarray] = {"tags": np.array(data.state["tags"]), "scores": np.array(scores, np.float32),
                                         "targets": test["targets"]}
        taggrams = [export("taggram", {"waveform": w[None, :]}) for w in test["waveforms"][:REPORT_TAGGRAMS]]
        for i, taggram in enumerate(taggrams):
            arrays.update({f"taggram/{i}": taggram["window_scores"][0], f"window_start/{i}": taggram["window_start"][0],
                           f"window_end/{i}": taggram["window_end"][0],
                           f"clip/{i}": np.array(Path(test["paths"][i]).name)})
        if taggrams:
            arrays["taggram_tags"] = np.array([tag.decode("utf-8") for tag in taggrams[0]["tags"][0]])
        return arrays

    def report_sections(self, result: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[Section]:
        """ROC curves per tag group (``roc-curves``), taggrams (``taggram``), per-tag AUC (``per-tag-auc``), and the
        seen and held-out soundfonts' test splits (``soundfonts``) when the corpus has a held-out one."""
        missing = Text("(no report data: the figures are drawn from what the run saved)")
        roc: list[Block] = [_roc_figure(result, arrays)] if "scores" in arrays else [missing]
        taggrams: list[Block] = [_taggram_figure(arrays, i) for i in range(REPORT_TAGGRAMS) if f"taggram/{i}" in arrays]
        return [Section("ROC curves per tag group", roc, anchor="roc-curves"),
                Section("Taggrams", [Text("Each window's score per tag (the export's taggram signature) for a few "
                                          "test clips; the clip's own tags are marked *."), *(taggrams or [missing])],
                        anchor="taggram"),
                _per_tag_auc_section(result), *_soundfont_sections(result)]

    def limits(self, config: MusicTaggingConfig, data: Splits) -> Limits:
        samples = int(data.state["max_seconds"] * data.state["sample_rate"])
        # a WAV of max_seconds at up to 48 kHz, 16-bit stereo, plus its header
        return Limits(max_batch_size=64, max_audio_samples=samples,
                      max_string_bytes=int(data.state["max_seconds"] * 48000 * 4) + 4096)

    def predict_inputs(self, state: dict[str, Any], inputs: list[str], signature: Any) -> dict[str, np.ndarray]:
        """Reads audio files (any format ``read_audio`` reads) at the model rate, one row each
        (``audio.signature_rows``: a zero-padded batch, or WAV bytes for ``wav_bytes``)."""
        if not inputs:
            raise DataError("expected one or more audio files")
        rate = int(state["sample_rate"])
        waveforms = [audio.read_audio(name, rate, state["max_seconds"]) for name in inputs]
        return audio.signature_rows(waveforms, rate, wav="wav" in signature.inputs)

    def format_prediction(self, state: dict[str, Any], inputs: dict[str, np.ndarray],
                          outputs: dict[str, np.ndarray], signature: str = "serving_default",
                          given: Sequence[str] = ()) -> tuple[str, Any]:
        """Lists each file's tags at or above their thresholds, best first, with scores; for ``taggram``,
        the best tags of each window of the file, with its times."""
        files = row_inputs(given, inputs, len(next(iter(outputs.values()))))
        if signature == "taggram":
            seconds = inputs["length"] / float(state["sample_rate"]) if "length" in inputs else None
            return _taggram_text(files, outputs, seconds)
        rows, lines = [], []
        for name, scores in zip(files, outputs["scores"]):
            found = sorted(((float(s), tag) for tag, s, t in zip(state["tags"], scores, state["thresholds"])
                            if s >= t), reverse=True)
            rows.append({"file": name, "tags": [{"tag": tag, "score": round(s, 4)} for s, tag in found]})
            lines.append(f"{name}: " + (", ".join(f"{tag} {s:.2f}" for s, tag in found) or "(no tag above its "
                                        "threshold)"))
        return "\n".join(lines), {"predictions": rows}


def _roc_figure(result: dict[str, Any], arrays: dict[str, np.ndarray]) -> Figure:
    """A panel per tag group (``tag_groups``; plain tags in one more) with the ROC curve of each of its tags.

    The curves are ``seqapps.metrics.roc_curves`` of the saved test scores; a tag whose test clips
    are all positive or all negative has none (the run's ``skipped_tags``).
    """
    curves = roc_curves(arrays["targets"], arrays["scores"], [str(tag) for tag in arrays["tags"]])
    groups = tag_groups(curves)
    plain = [tag for tag in curves if ":" not in tag]
    if plain or not groups:
        groups[PLAIN_TAGS] = plain
    means = result.get("metrics", {}).get("roc_auc_per_group", {})
    rows = -(-len(groups) // ROC_COLUMNS)
    figure, panels = plots.canvas(rows, ROC_COLUMNS, height=2.7, squeeze=False)
    for panel, (group, tags) in itertools.zip_longest(panels.flat, groups.items(), fillvalue=(None, None)):
        if group is None:
            panel.axis("off")
            continue
        panel.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=0.8)
        for tag in tags:
            false_positives, true_positives = curves[tag]
            area = float(np.trapezoid(true_positives, false_positives))
            panel.plot(false_positives, true_positives, linewidth=1.2, label=f"{tag.partition(':')[2] or tag} "
                                                                              f"({area:.2f})")
        mean = f" (mean AUC {means[group]:.2f})" if group in means else ""
        panel.set_title(f"{group}{mean}", fontsize="small")
        panel.set(xlim=(0, 1), ylim=(0, 1.02))
        panel.tick_params(labelsize="x-small")
        if tags:
            panel.legend(fontsize="xx-small", loc="lower right")
    for panel in panels[-1]:
        panel.set_xlabel("false positive rate", fontsize="x-small")
    for panel in panels[:, 0]:
        panel.set_ylabel("true positive rate", fontsize="x-small")
    skipped = len(arrays["tags"]) - len(curves)
    return plots.to_figure("roc_curves", figure, f"ROC curves of the {len(arrays['scores'])} test clips, AUC in "
                           "brackets" + (f"; {skipped} tags whose test clips are all positive or all negative have "
                                         "no curve" if skipped else ""))


def _taggram_figure(arrays: dict[str, np.ndarray], index: int) -> Figure:
    """Clip ``index``'s taggram: a row per tag, a column per window (its start and end in seconds)."""
    windows = arrays[f"taggram/{index}"]
    tags = [str(tag) for tag in arrays["taggram_tags"]]
    own = {tag for tag, target in zip(tags, arrays["targets"][index]) if target}
    times = [f"{start:.1f}-{end:.1f} s" for start, end in zip(arrays[f"window_start/{index}"],
                                                             arrays[f"window_end/{index}"])]
    return plots.heatmap(f"taggram_{index}", f"taggram of {arrays[f'clip/{index}']}", windows.T, x_labels=times,
                         y_labels=[f"* {tag}" if tag in own else tag for tag in tags], xlabel="window",
                         colorbar="score", caption=f"the clip's tags: {', '.join(sorted(own)) or '(none known)'}")


def _soundfont_sections(result: dict[str, Any]) -> list[Section]:
    """A table of the test splits, seen soundfonts and held-out one, the model's ROC-AUC beside the baselines';
    none without a held-out split."""
    metrics, baselines = result.get("metrics", {}), result.get("baseline", {})
    if f"{HELD_OUT}/roc_auc_macro" not in metrics:
        return []
    soundfonts = result.get("data", {}).get("soundfonts") or {}
    splits = {"test": ", ".join(soundfonts.get("test", [])), HELD_OUT: ", ".join(soundfonts.get(HELD_OUT, []))}
    rows = [[f"{split} ({names})", *(values.get(f"{prefix}{key}") for values in (metrics, *baselines.values())
                                     for key in ("roc_auc_macro", "roc_auc_micro"))]
            for (split, names), prefix in zip(splits.items(), ("", f"{HELD_OUT}/"))]
    columns = [f"{name} ROC-AUC {kind}" for name in ("model", *baselines) for kind in ("macro", "micro")]
    return [Section("Seen and held-out soundfonts", [Table(["test split (soundfonts)", *columns], rows, caption=(
        "the same test pieces, rendered with the training soundfonts and with one that training never heard"))],
        anchor="soundfonts")]


def _per_tag_auc_section(result: dict[str, Any]) -> Section:
    """Each tag's and each group's test ROC-AUC, the model's beside the MFCC logistic regression's (table and bars)."""
    model = result.get("metrics", {})
    mfcc = result.get("baseline", {}).get("mfcc_logistic_regression", {})
    per_tag, baseline = model.get("roc_auc_per_tag", {}), mfcc.get("roc_auc_per_tag", {})
    if not per_tag:
        return Section("Per-tag ROC-AUC", [Text("(no tag has both positive and negative test clips)")],
                       anchor="per-tag-auc")
    rows = [[tag, value, baseline.get(tag), value - baseline[tag] if tag in baseline else None]
            for tag, value in per_tag.items()]
    groups = [[group, value, mfcc.get("roc_auc_per_group", {}).get(group)]
              for group, value in model.get("roc_auc_per_group", {}).items()]
    blocks: list[Block] = [
        plots.bar_chart("per_tag_auc", "test ROC-AUC per tag", {"model": per_tag, "MFCC logistic regression": baseline},
                        "ROC-AUC", caption="each tag with positive and negative test clips; 0.5 is chance (the "
                                           "tag priors' AUC)"),
        Table(["tag", "model", "MFCC baseline", "model - baseline"], rows,
              caption=f"{len(model.get('skipped_tags', {}))} tags with one class among the test clips are left out")]
    if groups:
        blocks.append(Table(["tag group", "model (mean AUC)", "MFCC baseline (mean AUC)"], groups))
    return Section("Per-tag ROC-AUC", blocks, anchor="per-tag-auc")


def _taggram_text(files: list[str], outputs: dict[str, np.ndarray], seconds: np.ndarray | None,
                  top: int = TAGGRAM_TOP) -> tuple[str, Any]:
    """The ``taggram`` signature's rows: per file, each window's times and its ``top`` best tags.

    Args:
        files: each row's INPUT.
        outputs: ``window_scores``, ``tags``, ``window_start`` and ``window_end``.
        seconds: each file's duration: a shorter file of a zero-padded batch shows only its own
            windows, the last one ending where the file does (None: every window of the batch).
        top: tags shown per window.

    Returns:
        ``(text, {"rows": [{"input", "tags", "windows": [{"start", "end", "scores", "top": [{"tag",
        "score"}]}]}]})``, ``scores`` in the order of ``tags``.
    """
    lines, rows = [], []
    for row, name in enumerate(files):
        tags = [tag.decode("utf-8") for tag in outputs["tags"][row]]
        duration = float("inf") if seconds is None else float(seconds[row])
        windows = []
        for start, end, scores in zip(outputs["window_start"][row], outputs["window_end"][row],
                                      outputs["window_scores"][row]):
            if windows and start >= duration:
                break
            best = np.argsort(-scores, kind="stable")[:top]
            windows.append({"start": round(float(start), 3), "end": round(min(float(end), duration), 3),
                            "scores": [round(float(s), 4) for s in scores],
                            "top": [{"tag": tags[i], "score": round(float(scores[i]), 4)} for i in best]})
        rows.append({"input": name, "tags": tags, "windows": windows})
        lines.append(f"{name}:")
        lines += [f"  {w['start']:.1f}-{w['end']:.1f} s: " + ", ".join(f"{t['tag']} {t['score']:.2f}" for t in w["top"])
                  for w in windows]
    return "\n".join(lines), {"rows": rows}
