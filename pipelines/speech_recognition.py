"""Speech recognition: a deep bidirectional RNN with CTC, from waveform to transcript (Graves and Jaitly 2014).

Model (``seqapps.layers.ctc.CTCSpeechModel``): log-mel features computed in the
graph, normalised per utterance, time subsampled by a strided convolution, then
stacked bidirectional GRU/LSTM layers and logits over the characters plus the CTC
blank, trained with ``tf.nn.ctc_loss``. ``--set encoder=hrnn`` swaps the recurrent
stack for a causal ``DecoupledHRNN`` (lower level at the subsampled frame rate,
upper level every ``hrnn_periods`` frames), trained in its memory-lean mode, behind
the same strided convolution (trained through the gradient the lean path returns for
the layer's inputs; ``conv_filters=0`` stacks frames instead). ``--set encoder=bihrnn`` reads the frames both ways with a
``BidirectionalHRNN`` (the same layer and a copy on the reversed frames, their logits summed), which
sees what the BiGRU sees.

Data: without ``--data``, a spoken-sentence corpus generated into ``$SEQAPPS_DATA``
(``seqapps.data.speech``; sentences from the KJV Bible, public domain, or for ``tiny``
from Python's help topics, PSF) by the synthesisers ``sources`` lists: the default
trains on espeak-ng (pip ``espeakng-loader``, GPL-3+), two Festival voices (apt
``festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts``) and SVOX Pico's two
female voices (pip ``ttspico``, Apache-2.0, the ``[speech]`` extra), ``tiny`` on
espeak-ng alone. Validation and test read sentences that training never reads, and
the test split holds one test set per entry of ``test_sets``: espeak-ng voice variants
that training never hears, a Festival voice it never hears, and an engine it never
uses (CMU Flite, apt ``flite``). ``--data folder/ --set csv=metadata.csv`` reads a folder of audio
files with a ``path,transcript`` table (LJSpeech / Common Voice layout); ``val_fraction``
and ``test_fraction`` of the rows (at least one each, drawn by ``seed``) go to validation and test.
Transcripts are lower-cased; the character set is learned from the training
transcripts. Fine-tuning extends the export's character set with the new characters
of the training transcripts (``vocabulary=extend``, the default): each gets an output
unit after the old ones (the blank stays class 0; old units keep their weights), and
the export's in-graph character table holds it. ``vocabulary=keep`` keeps the export's
characters. A character outside the character set is an error listing it
(``oov=error``) or is deleted (``oov=drop``). Clips longer than ``max_seconds``, silent
clips, and transcripts too long for their audio's frames are errors naming the row.

Decoding: greedy, or a CTC prefix beam search that reads a character n-gram model of the
training transcripts (``lm_order``; ``seqapps.layers.ngram_lm``, shallow fusion as in Graves
and Jaitly 2014); ``lm_order=0`` leaves the plain CTC beam search. The language model's weight
and a bonus per character are chosen on the validation split from ``lm_choices`` (the pair of
the lowest beam CER; ``[0, 0]`` is the search without it). Fine-tuning counts the new training
transcripts afresh and chooses again.

Metrics: CER and WER (``jiwer``) of greedy and beam decoding on the test split (and of the
beam search without the language model, ``beam_no_lm_*``, when there is one),
beside two baselines: the empty transcript and the most frequent training sentence;
on the generated corpus also per test set (``test_sets``, named by engine and voice, with
whether the voice or the whole engine is held out) and per held-out voice (``per_voice``).

Report: for a few test utterances, the log-mel under the CTC posteriors with the words
and times of the ``words`` signature drawn over both (the log-mel and the posteriors
come from the trained model, which the export holds: the export has no signature for
them); CER and WER per test set and per held-out voice beside the baselines.

Export (waveforms at 16 kHz, zero-padded):
- ``serving_default``: ``waveform`` float32 [batch, samples], ``length`` int32 [batch]
  -> ``transcript`` string [batch], ``score`` float32 [batch] (greedy path log-probability).
- ``beam``: the same inputs -> the beam-search transcript and its score (the CTC log-probability,
  plus the language model's weighted log-probability and the length bonus when the export has one).
- ``wav_bytes``: ``wav`` string [batch] (WAV: PCM of 8 to 32 bits or float, 1 to 384 kHz,
  resampled in-graph; ``audio.decode_wav``)
  -> ``transcript``, ``score``.
- ``words``: the same inputs as ``serving_default`` -> ``words`` string [batch, W],
  ``start``/``end`` seconds and ``confidence`` float32 [batch, W], ``num_words`` int32
  [batch]: the words of the greedy transcript with their times from the CTC posteriors.
A waveform holding NaN or Inf, or longer than ``max_seconds``, is rejected
(InvalidArgument, HTTP 400; ``seqapps predict`` cuts long files itself, and sends their pieces
``predict_rows_per_call`` at a time); samples beyond full
scale are clipped to [-1, 1] (``audio.bounded``), so no score is NaN. Silence is
valid input; what it decodes to is whatever the model emits for floor-level features
(an untrained model may emit characters).
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import textwrap
from pathlib import Path
from typing import Any, Sequence

import keras
import numpy as np
import tensorflow as tf

from seqapps import predictions
from seqapps.config import TrainingConfig, require, require_split_fractions
from seqapps.data import audio, datasets, samples, speech
from seqapps.data import splits as split_rule
from seqapps.data import text as text_data
from seqapps.errors import ConfigError, DataError
from seqapps.export import ExportCalls, Limits, ServingModule, Signature
from seqapps.finetuning import (VOCABULARY_CHOICES, VocabularyMap, grow_vocabulary, transfer_weights,
                                vocabulary_report)
from seqapps.layers import augment as augmentation
from seqapps.layers import ctc, ngram_lm
from seqapps.metrics import character_error_rate, word_error_rate
from seqapps.pipeline import INPUT_INDEX, SPLIT_COUNTS, VOCABULARIES, Headline, Pipeline, Splits, row_inputs
from seqapps.report import plots
from seqapps.report.document import Block, Figure, Section, Table, Text

CORPORA = {"kjv": lambda: text_data.kjv_bible().lines, "pydoc": lambda: text_data.pydoc_topics().lines}
SPLITS = ("train", "val", "test")
REPORT_UTTERANCES = 3  # test utterances the report draws
ALL_VOICES = "all test voices"
CLIPS_PER_READ = 256  # clips decoded and joined at a time when a split is loaded


@dataclasses.dataclass
class SpeechRecognitionConfig(TrainingConfig):
    """Speech recognition settings.

    Attributes:
        corpus: sentences of the generated corpus without ``--data``: "kjv" or "pydoc".
        sources: the synthesisers that speak the generated training and validation utterances, in turn:
            ``engine`` or ``engine:voice`` (``seqapps.data.speech.Source``; engines espeak, festival, flite, pico).
        test_sets: one generated test set per entry, each a source that training never hears.
        train_utterances, val_utterances, test_utterances: generated utterances per split (test: per test set).
        csv: the transcript table inside the ``--data`` folder.
        val_fraction, test_fraction: shares of the user's rows held out.
        vocabulary: at fine-tuning, "extend" (characters of the training transcripts that the export cannot
            emit get new output units) or "keep" (the export's characters only; ``oov`` decides the rest).
        oov: transcript characters outside the character set: "error" or "drop".
        max_seconds: the longest clip (training data and ``seqapps predict`` windows).
        n_mels, n_fft, hop_length: the log-mel front end (samples at 16 kHz).
        stride: time subsampling of the features.
        conv_filters: filters of the subsampling convolution (0: stack frames).
        encoder: "birnn", "hrnn" (causal) or "bihrnn" (an HRNN each way).
        cell: "gru" or "lstm".
        units: units per direction of each layer (birnn) or per level (hrnn).
        dropout: between recurrent layers (birnn).
        hrnn_periods, hrnn_mode: the HRNN's ticks and training mode.
        beam_width: beams of the CTC beam search.
        lm_order: n of the character n-gram model of the training transcripts that the beam search reads
            (``seqapps.layers.ngram_lm``; 0: none, the plain CTC beam search).
        lm_choices: ``[weight, bonus]`` pairs of the language model's weight and the score added per character
            in the beam search; the pair of the lowest validation beam CER is kept (one pair: that one).
        augment: augmentations of each training batch, in the graph and never in the export: of the
            waveform (``seqapps.layers.augment.AUGMENTATIONS``: speed, pitch, noise, reverb, telephone) and of
            the log-mel (``FEATURE_AUGMENTATIONS``: vtlp, specaugment).
        augment_probability: the share of training examples each augmentation but speed touches.
        vtlp_warp: the lowest and highest warp factor of ``vtlp`` (above 1: the formants of a shorter vocal tract).
    """

    corpus: str = "kjv"
    # SVOX Pico's two female voices against none, the same 25 minutes: beam CER 20.0 % against 27.0 % on the held-out
    # engine (Flite), 24.3 % against 51.9 % on the held-out Festival voice, 6.8 % against 6.1 % on the held-out
    # espeak-ng voices (docs/results.md)
    sources: list[str] = dataclasses.field(
        default_factory=lambda: ["espeak", "festival:kal_diphone", "festival:ked_diphone", "pico"])
    test_sets: list[str] = dataclasses.field(default_factory=lambda: ["espeak", "festival:cmu_us_slt_arctic_hts",
                                                                      "flite"])
    # 24,000 against 12,000: beam CER 14.9 % against 20.0 % on the held-out espeak-ng voices in the same 25 minutes,
    # for about 4.5 minutes of synthesis on the first run and 7.6 GiB peak memory against 4.6 (docs/results.md)
    train_utterances: int = 24000
    val_utterances: int = 200
    test_utterances: int = 200
    csv: str = "metadata.csv"
    val_fraction: float = 0.05
    test_fraction: float = 0.1
    vocabulary: str = "extend"
    oov: str = "error"
    max_seconds: float = 15.0
    n_mels: int = 40
    n_fft: int = 400
    hop_length: int = 160
    stride: int = 3
    conv_filters: int = 96
    encoder: str = "birnn"
    cell: str = "gru"
    # 256 against 128 units per direction: beam CER 11.4 % against 14.7 % on the held-out espeak-ng voices and 34.7 %
    # against 36.7 % on Flite in the same 25 minutes, at 0.61x the steps (docs/results.md, "A larger model")
    units: list[int] = dataclasses.field(default_factory=lambda: [256, 256])
    dropout: float = 0.1
    hrnn_periods: int = 4
    hrnn_mode: str = "decoupled"
    # 32 against 16 beams with the language model, the weight chosen on validation: beam CER 27.3 % against 28.1 % on
    # Flite and 53.1 % against 55.2 % on the held-out HTS voice at seed 42 (R10), 25.6 % against 26.0 % and 48.7 %
    # against 50.7 % at seed 7 (R9), the held-out espeak-ng voices within 0.1 points; since the search reads the
    # language model for extended beams only, 32 beams cost what 16 did before (docs/results.md, 7 December)
    beam_width: int = 32
    # a character 8-gram model of the training transcripts in the beam search: beam CER 7.0 % against 11.7 % on the
    # held-out espeak-ng voices, 27.8 % against 34.8 % on Flite (R5's model, weight 0.8 and bonus 2 chosen on
    # validation); the choices hold the search without it, for a model or a corpus where it does not help
    lm_order: int = 8
    lm_choices: list[list[float]] = dataclasses.field(
        default_factory=lambda: [[0.0, 0.0], [0.5, 1.0], [0.8, 2.0], [1.2, 2.0]])
    # none here: under the 2-core time budget the resampling ones (speed, pitch) cost two thirds of the steps, and
    # all five together left the model worse on every test set (docs/results.md, issue 26); the default preset
    # warps the mel axis (vtlp), which costs no steps
    augment: list[str] = dataclasses.field(default_factory=list)
    augment_probability: float = 0.5
    vtlp_warp: list[float] = dataclasses.field(default_factory=lambda: list(augmentation.VTLP_WARP))
    batch_size: int = 16
    # clips of similar length share a batch: random batches of 16 were 37 % padding, and the RNN steps through
    # every padded frame (docs/results.md, "Batches of similar length")
    length_sorted_batches: int = 32
    learning_rate: float = 1e-3
    epochs: int = 12
    early_stopping_patience: int = 3
    # the budget ends the run before the plateau schedule halves the rate; falling linearly over it instead gave
    # 35.7 % against 38.0 % beam CER on Flite and 14.2 % against 14.8 % on the held-out espeak-ng voices, at
    # 48,000 utterances on one machine (docs/results.md, "A learning rate that falls with the budget")
    lr_schedule: str = "budget"
    lr_patience: int = 1
    # the target is 30 minutes on 2 cores; data, evaluation and export took about one minute more
    max_train_minutes: float | None = 25.0

    PRESETS = {
        "tiny": {"corpus": "pydoc", "sources": ["espeak"], "test_sets": ["espeak"], "train_utterances": 24,
                 "val_utterances": 4, "test_utterances": 4, "n_mels": 20, "conv_filters": 16, "units": [16],
                 "epochs": 1, "batch_size": 8, "beam_width": 2, "lm_order": 3,
                 "max_train_minutes": None},
        # VTLP against none, same corpus and machine: beam CER 58.4 % against 61.9 % on the held-out HTS voice,
        # 36.7 % against 37.4 % on Flite, 14.7 % against 14.6 % on the espeak-ng voices (docs/results.md)
        "default": {"augment": ["vtlp"]},
        "full": {"train_utterances": 40000, "val_utterances": 1000, "test_utterances": 700,
                 "conv_filters": 256, "units": [320, 320, 320], "epochs": 40, "early_stopping_patience": 5,
                 "augment": list(augmentation.AUGMENTATIONS),
                 "max_train_minutes": None},
    }

    def validate(self) -> None:
        super().validate()
        require(self.corpus in CORPORA, "corpus", self.corpus, f"one of {', '.join(CORPORA)}")
        expected = f"a list of engine or engine:voice (engines {', '.join(speech.ENGINE_TITLES)})"
        sources = _sources(self.sources)
        require(bool(sources), "sources", self.sources, expected)
        tests = _sources(self.test_sets)
        require(bool(tests), "test_sets", self.test_sets, expected)
        heard = next((str(test) for test in tests if _heard_in_training(test, sources)), None)
        require(heard is None, "test_sets", self.test_sets, f"sources that training never hears ({heard} is one of "
                f"sources={','.join(self.sources)})")
        for name in ("train_utterances", "val_utterances", "test_utterances", "n_mels", "n_fft", "hop_length",
                     "stride", "hrnn_periods", "beam_width"):
            require(getattr(self, name) >= 1, name, getattr(self, name), "an integer >= 1")
        require_split_fractions(self.val_fraction, self.test_fraction)
        require(self.vocabulary in VOCABULARY_CHOICES, "vocabulary", self.vocabulary,
                f"one of {', '.join(VOCABULARY_CHOICES)}")
        require(self.oov in speech.OOV_POLICIES, "oov", self.oov, f"one of {', '.join(speech.OOV_POLICIES)}")
        require(self.max_seconds > 0, "max_seconds", self.max_seconds, "a number > 0")
        require(0 <= self.lm_order <= ngram_lm.MAX_ORDER, "lm_order", self.lm_order,
                f"an integer from 0 (no language model) to {ngram_lm.MAX_ORDER}")
        require(bool(self.lm_choices) and all(isinstance(pair, list) and len(pair) == 2 and pair[0] >= 0
                                              for pair in self.lm_choices),
                "lm_choices", self.lm_choices, "a list of [weight, bonus] pairs, each weight >= 0")
        require(self.conv_filters >= 0, "conv_filters", self.conv_filters, "an integer >= 0")
        require(self.encoder in ctc.ENCODERS, "encoder", self.encoder, f"one of {', '.join(ctc.ENCODERS)}")
        require(self.cell in ctc.CELLS, "cell", self.cell, f"one of {', '.join(ctc.CELLS)}")
        require(bool(self.units) and min(self.units) >= 1, "units", self.units, "a list of integers >= 1")
        require(self.encoder not in ctc.HRNN_ENCODERS or len(self.units) >= 2, "units", self.units,
                f"at least two integers (one per HRNN level) with encoder={self.encoder}")
        require(0 <= self.dropout < 1, "dropout", self.dropout, "a number in [0, 1)")
        require(set(self.augment) <= set(augmentation.ALL_AUGMENTATIONS), "augment", self.augment,
                f"a list of {', '.join(augmentation.ALL_AUGMENTATIONS)} (or empty)")
        require(0 < self.augment_probability <= 1, "augment_probability", self.augment_probability,
                "a number in (0, 1]")
        require(len(self.vtlp_warp) == 2 and 0 < self.vtlp_warp[0] <= self.vtlp_warp[1], "vtlp_warp",
                self.vtlp_warp, "two numbers low,high with 0 < low <= high")


def _output_frames(config: SpeechRecognitionConfig, samples: int) -> int:
    """Output frames of a clip (as ``CTCSpeechModel.output_lengths``: centred STFT frames, subsampled)."""
    return -(-(1 + samples // config.hop_length) // config.stride)


def _ctc_frames_needed(ids: list[int]) -> int:
    """Frames a CTC path needs: one per label plus a blank between equal neighbours."""
    return len(ids) + sum(a == b for a, b in itertools.pairwise(ids))


class SpeechRecognition(Pipeline):
    """Speech to text: a deep bidirectional RNN (or decoupled HRNN) with CTC over characters, and word timings."""

    Config = SpeechRecognitionConfig
    predict_input = ("audio files (WAV, FLAC, OGG or MP3), one per row (a long one is cut at silences); "
                     "--signature words: word times")
    predict_rows_per_call = 8  # pieces of max_seconds: a long recording is transcribed 8 pieces at a time

    # --- data -------------------------------------------------------------------------------

    headline_metrics = (Headline("greedy_cer", "CER greedy", "%", 100.0, "cer", higher_is_better=False),
                        Headline("beam_cer", "CER beam", "%", 100.0, "cer", higher_is_better=False),
                        Headline("beam_no_lm_cer", "CER beam, no LM", "%", 100.0, "cer", higher_is_better=False),
                        Headline("greedy_wer", "WER greedy", "%", 100.0, "wer", higher_is_better=False),
                        Headline("beam_wer", "WER beam", "%", 100.0, "wer", higher_is_better=False))

    def write_sample_data(self, folder: Path, seed: int = 0) -> tuple[str | None, list[str]]:
        """30 sentences spoken by espeak-ng, some with accented letters (café, señor) the tiny corpus lacks."""
        sentences = samples.sample_sentences(30, seed)
        sentences[1::3] = [f"{line} {'at the café' if i % 2 else 'with the señor'}"
                           for i, line in enumerate(sentences[1::3])]
        _, files = samples.write_spoken_sentences(folder / "recordings", sentences)
        return str(folder / "recordings"), [str(files[0]), str(files[1])]

    def load_data(self, config: SpeechRecognitionConfig, data_path: str | None,
                  state: dict[str, Any] | None = None) -> Splits:
        words: dict[str, list] = {}
        if datasets.is_tfds(data_path):
            rows = speech.read_transcripts(datasets.tfds_audio_folder(data_path))
            source = {"source": data_path, "licence": "see the tensorflow-datasets catalog"}
        elif data_path:
            rows = speech.read_transcripts(data_path, config.csv)
            source = {"source": str(Path(data_path) / config.csv), "licence": "the user's"}
        else:
            spec = speech.CorpusSpec(config.corpus, {"train": config.train_utterances, "val": config.val_utterances,
                                                      "test": config.test_utterances}, seed=config.seed,
                                     sources=list(config.sources), test_sets=list(config.test_sets))
            root = speech.spoken_corpus(spec, CORPORA[config.corpus])
            parts, words = speech.read_generated(root)
            engines = ", ".join(dict.fromkeys(speech.ENGINE_TITLES[s.engine]
                                              for s in _sources([*config.sources, *config.test_sets])))
            source = {"source": f"{engines} ({root})", "licence": f"generated ({engines}: GPL or BSD-like; text "
                      + ("public domain KJV" if config.corpus == "kjv" else "PSF pydoc topics") + ")",
                      "sources": list(config.sources),
                      "test_sets": {str(s): _test_set_title(s, config.sources) for s in _sources(config.test_sets)}}
        if data_path:
            labels = split_rule.assign_splits(len(rows), config.val_fraction, config.test_fraction, source["source"],
                                              "utterances", "shuffle", config.seed)
            parts = {name: [rows[i] for i in part] for name, part in split_rule.split_indices(labels).items()}
        trained_chars = [c for u in parts["train"] for c in u.transcript]
        exported_chars = len(state["chars"]) - 1 if state else None  # fine-tuning: the export's characters
        if state is None:
            # the generated corpus speaks letters, the apostrophe and spaces by construction
            chars = sorted(set(speech.SPOKEN_CHARS if not data_path else trained_chars) | {" "})
            state = {"chars": ["", *chars], "sample_rate": speech.SAMPLE_RATE, "max_seconds": config.max_seconds}
        elif config.vocabulary == "extend":  # new characters get output units after the old ones (and the blank)
            state = {**state, "chars": grow_vocabulary(state["chars"], trained_chars)}
        charset = state["chars"][1:]
        # the test characters outside the character set are counted before oov= drops or refuses them
        characters = vocabulary_report(exported_chars or len(charset), charset,
                                       (c for u in parts["test"] for c in u.transcript))
        index = {c: i for i, c in enumerate(state["chars"]) if c}
        split_data, arrays = {}, {}
        for split in SPLITS:
            utterances = speech.apply_charset(parts[split], charset, config.oov)
            labels = [[index[c] for c in u.transcript] for u in utterances]
            inputs = audio.clip_dataset(*_read_clips(utterances, labels, config))  # holds the one copy it keeps
            targets = tf.data.Dataset.from_tensor_slices(tf.ragged.constant(labels, dtype=tf.int32))
            split_data[split] = tf.data.Dataset.zip(inputs, targets).map(_to_float)
            arrays[split] = {"transcripts": [u.transcript for u in utterances],
                             "paths": [str(u.path) for u in utterances],
                             "speakers": [u.speaker for u in utterances],
                             "sources": [u.source for u in utterances]}
        arrays["words"] = words
        arrays["language_model"] = _language_model(config, arrays["train"]["transcripts"], state["chars"])
        sizes = {s: len(arrays[s]["transcripts"]) for s in SPLITS}
        report = {**source, "utterances": sizes, SPLIT_COUNTS: split_rule.split_counts("utterances", sizes),
                  "characters": len(charset),
                  VOCABULARIES: {"characters": characters}}
        return Splits(split_data["train"], split_data["val"], split_data["test"], state=state, report=report, arrays=arrays)

    # --- model ------------------------------------------------------------------------------

    def build_model(self, config: SpeechRecognitionConfig, data: Splits) -> keras.Model:
        model = ctc.CTCSpeechModel(
            num_classes=len(data.state["chars"]), sample_rate=data.state["sample_rate"], n_fft=config.n_fft,
            hop_length=config.hop_length, n_mels=config.n_mels, stride=config.stride,
            conv_filters=config.conv_filters, encoder=config.encoder, cell=config.cell, units=config.units,
            dropout=config.dropout, hrnn_periods=config.hrnn_periods, hrnn_mode=config.hrnn_mode,
            augment=config.augment, augment_probability=config.augment_probability,
            vtlp_warp=config.vtlp_warp, seed=config.seed, name=self.name)
        model.build()
        return model

    def adapt_model(self, model: ctc.CTCSpeechModel, config: SpeechRecognitionConfig,
                    data: Splits) -> ctc.CTCSpeechModel:
        """Adds output units for new characters: every weight is kept, the new characters' units start fresh.

        The new characters follow the exported ones (``load_data``), so the blank stays class 0 and every
        old character keeps its class and its unit's weights.
        """
        chars = data.state["chars"]
        if model.num_classes == len(chars):
            return model
        grown = self.build_model(config, data)
        grown_classes = VocabularyMap.from_tokens(chars[:model.num_classes], chars)
        transfer_weights(model, grown, {layer.path: grown_classes for layer in grown.logits_layers})
        return grown

    def compile_args(self, config: SpeechRecognitionConfig, data: Splits) -> dict[str, Any]:
        return {"jit_compile": False}  # the model's train_step computes the CTC loss

    # --- evaluation -------------------------------------------------------------------------

    def transcribe(self, model: keras.Model, dataset: tf.data.Dataset, chars: list[str], beam_width: int,
                   language_model: ngram_lm.CharNgramLM | None = None,
                   fusions: Sequence[tuple[float, float]] = ()) -> dict[str, list]:
        """Transcripts and the greedy words' start times of a dataset of ``(inputs, labels)``.

        Args:
            model: the trained model.
            dataset: the clips and their labels.
            chars: the text of each class.
            beam_width: the beams of both searches.
            language_model: the character model the ``fusions`` read.
            fusions: ``(weight, bonus)`` pairs of the beam search with the language model.

        Returns:
            ``greedy``, ``beam`` (the plain CTC beam search), ``starts`` (each greedy word's start time) and, for
            fusion ``i``, ``fused_i``.
        """
        table = tf.constant(chars)
        space_id = chars.index(" ")
        kinds = ["greedy", "beam", *(f"fused_{i}" for i in range(len(fusions)))]

        @tf.function(reduce_retracing=True)
        def decode(inputs: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor, dict[str, tf.Tensor], dict]:
            logits = model(inputs, training=False)
            lengths = model.output_lengths(inputs["length"])
            spans = ctc.ctc_word_spans(logits, lengths, table, space_id, model.seconds_per_frame)
            texts = {"greedy": ctc.ids_to_text(ctc.ctc_greedy_decode(logits, lengths)[0], table),
                     "beam": ctc.ids_to_text(ctc.ctc_beam_decode(logits, lengths, beam_width)[0], table)}
            return logits, lengths, texts, spans

        # One graph serves every (weight, bonus) pair: tracing the search is most of the cost on small sets.
        @tf.function(reduce_retracing=True)
        def fuse(logits: tf.Tensor, lengths: tf.Tensor, weight: tf.Tensor, bonus: tf.Tensor) -> tf.Tensor:
            ids, _ = ctc.ctc_lm_beam_decode(logits, lengths, language_model, beam_width, weight, bonus, space_id)
            return ctc.ids_to_text(ids, table)

        found: dict[str, list] = {kind: [] for kind in [*kinds, "starts"]}
        for inputs, _ in dataset.padded_batch(16):
            logits, lengths, texts, spans = decode(inputs)
            for i, (weight, bonus) in enumerate(fusions):
                texts[f"fused_{i}"] = fuse(logits, lengths, tf.constant(weight, tf.float32),
                                           tf.constant(bonus, tf.float32))
            for kind in kinds:
                found[kind] += [t.decode("utf-8") for t in texts[kind].numpy()]
            found["starts"] += [row[:n].tolist() for row, n in zip(spans["start"].numpy(), spans["num_words"].numpy())]
        return found

    def calibrate(self, model: keras.Model, config: SpeechRecognitionConfig, data: Splits) -> dict[str, Any]:
        """Chooses the language model's weight and bonus: the ``lm_choices`` pair of the lowest validation beam CER.

        Returns:
            ``{"lm_weight": w, "lm_bonus": b, "val_beam_cer_by_lm": {"w,b": CER}}`` (no CERs with one choice),
            or ``{}`` without a language model.
        """
        language_model = data.arrays.get("language_model")
        if language_model is None:
            return {}
        choices = [(float(weight), float(bonus)) for weight, bonus in config.lm_choices]
        if len(choices) == 1:
            return {"lm_weight": choices[0][0], "lm_bonus": choices[0][1]}
        found = self.transcribe(model, data.val, data.state["chars"], config.beam_width, language_model, choices)
        truth = data.arrays["val"]["transcripts"]
        cer = [character_error_rate(truth, found[f"fused_{i}"]) for i in range(len(choices))]
        weight, bonus = choices[int(np.argmin(cer))]  # the first of equal CERs
        return {"lm_weight": weight, "lm_bonus": bonus,
                "val_beam_cer_by_lm": {f"{w:g},{b:g}": value for (w, b), value in zip(choices, cer)}}

    def evaluate(self, model: keras.Model, config: SpeechRecognitionConfig,
                 data: Splits) -> tuple[dict[str, float], dict[str, Any]]:
        """CER and WER of greedy and beam (``config.beam_width``) decoding on the test split, beside the baselines.

        Args:
            model: the trained model.
            config: the resolved config.
            data: the splits.

        Returns:
            ``(metrics, baselines)``: ``greedy_cer``, ``greedy_wer``, ``beam_cer``, ``beam_wer`` (the ``beam``
            signature's search), with a language model ``lm_weight`` and ``lm_bonus`` (the chosen pair; both 0
            when the search without it was chosen) and otherwise also ``beam_no_lm_cer`` and ``beam_no_lm_wer``
            (and, on the generated corpus, the word start times' error over the engines that give word times,
            ``test_sets``: those four and ``utterances`` per test set, named by ``_test_set_title``, and
            ``per_voice``: the same per held-out voice), and the CER and WER of the empty transcript and
            of the most frequent training sentence.
        """
        truth = data.arrays["test"]["transcripts"]
        language_model = data.arrays.get("language_model")
        fusion = _fusion(data)
        found = self.transcribe(model, data.test, data.state["chars"], config.beam_width, language_model,
                                [fusion] if fusion else [])
        if fusion:  # the beam signature reads the language model; the plain search is shown beside it
            found["beam_no_lm"], found["beam"] = found["beam"], found.pop("fused_0")

        def scores(rows: Sequence[int], hypotheses: Sequence[str]) -> dict[str, float]:
            references, chosen = [truth[i] for i in rows], [hypotheses[i] for i in rows]
            return {"cer": character_error_rate(references, chosen), "wer": word_error_rate(references, chosen)}

        def decoded(rows: Sequence[int]) -> dict[str, float]:
            return {f"{kind}_{name}": value for kind in found if kind != "starts"
                    for name, value in scores(rows, found[kind]).items()}

        every = range(len(truth))
        metrics: dict[str, Any] = decoded(every)
        if language_model is not None and "lm_weight" in data.state:  # 0 and 0: the search without it was chosen
            metrics["lm_weight"], metrics["lm_bonus"] = float(data.state["lm_weight"]), float(data.state["lm_bonus"])
        speakers = data.arrays["test"]["speakers"]
        if all(speakers):  # the generated corpus: whole voices and engines are held out
            titles = {str(s): _test_set_title(s, config.sources) for s in _sources(config.test_sets)}
            for key, labels, name in (("test_sets", data.arrays["test"]["sources"], titles.get),
                                      ("per_voice", speakers, str)):
                groups: dict[str, list[int]] = {}
                for row, label in enumerate(labels):
                    groups.setdefault(label, []).append(row)
                order = list(titles) if key == "test_sets" else sorted(groups)
                metrics[key] = {name(label): {**decoded(groups[label]), "utterances": len(groups[label])}
                                for label in order if label in groups}
        if data.arrays["words"]:
            metrics.update(_word_timing_error(data, found))
        common = collections.Counter(data.arrays["train"]["transcripts"]).most_common(1)[0][0]
        return metrics, {"empty_transcript": scores(every, [""] * len(truth)),
                         "most_frequent_sentence": scores(every, [common] * len(truth))}

    # --- export and prediction --------------------------------------------------------------

    def serving_module(self, model: keras.Model, config: SpeechRecognitionConfig, data: Splits) -> ServingModule:
        """The recognition signatures (``serving_default``, ``beam``, ``words``, ``wav_bytes``) of the module docstring.

        Args:
            model: the trained model.
            config: the resolved config (``beam_width`` for the ``beam`` signature).
            data: the splits; the state's characters are a constant of each signature.

        Returns:
            The module; it needs no lookup table (class ``i``'s text is ``chars[i]``, gathered in the graph).
        """
        chars = tf.constant(data.state["chars"])
        space_id = data.state["chars"].index(" ")
        language_model = data.arrays.get("language_model")
        fusion = _fusion(data)
        rate = int(data.state["sample_rate"])
        max_samples = int(data.state["max_seconds"] * rate)
        spec = {"waveform": tf.TensorSpec([None, None], tf.float32, name="waveform"),
                "length": tf.TensorSpec([None], tf.int32, name="length")}
        # the first test clips, zero-padded: the export's example and warm-up request
        example = audio.signature_rows([inputs["waveform"].numpy() for inputs, _ in data.test.take(2)], rate, wav=False)

        def checked(raw: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            waveform = audio.bounded(raw["waveform"])
            bounded = tf.debugging.assert_less_equal(
                tf.shape(waveform)[1], max_samples,
                message=f"a waveform is longer than max_seconds ({max_samples} samples at {rate} Hz); cut it")
            with tf.control_dependencies([bounded]):
                length = tf.clip_by_value(raw["length"], 0, tf.shape(waveform)[1])
            return {"waveform": waveform, "length": length}

        def from_wav(raw: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            waveform, length = audio.decode_wav(raw["wav"], rate, max_samples=max_samples)
            return {"waveform": waveform, "length": length}

        def logits(inputs: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
            return model(inputs, training=False), model.output_lengths(inputs["length"])

        def greedy(inputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            ids, score = ctc.ctc_greedy_decode(*logits(inputs))
            return {"transcript": ctc.ids_to_text(ids, chars), "score": score}

        def beam(inputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            if fusion:
                ids, score = ctc.ctc_lm_beam_decode(*logits(inputs), language_model, config.beam_width, *fusion,
                                                    space_id)
            else:
                ids, score = ctc.ctc_beam_decode(*logits(inputs), config.beam_width)
            return {"transcript": ctc.ids_to_text(ids, chars), "score": score}

        def words(inputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            spans = ctc.ctc_word_spans(*logits(inputs), chars, space_id, model.seconds_per_frame)
            duration = tf.cast(inputs["length"], tf.float32)[:, None] / rate  # the last frame overhangs the end
            return {**spans, "start": tf.minimum(spans["start"], duration), "end": tf.minimum(spans["end"], duration)}

        wav_example = {"wav": np.array([audio.wav_bytes(w[:n], rate) for w, n in zip(example["waveform"],
                                                                                 example["length"])], dtype=object)}
        resources = {"language_model": language_model} if fusion else {}
        return ServingModule(model, {
            "serving_default": Signature(spec, example, greedy, checked),
            "beam": Signature(spec, example, beam, checked),
            "words": Signature(spec, example, words, checked),
            "wav_bytes": Signature({"wav": tf.TensorSpec([None], tf.string, name="wav")}, wav_example, greedy,
                                   from_wav)}, resources=resources)

    # --- report -----------------------------------------------------------------------------

    def report_data(self, model: ctc.CTCSpeechModel, config: SpeechRecognitionConfig, data: Splits,
                    export: ExportCalls) -> dict[str, np.ndarray]:
        """The first ``REPORT_UTTERANCES`` test utterances: log-mel, CTC posteriors and the ``words`` signature's words.

        The words and their times are the export's (a zero-padded batch, as a user sends it); the
        log-mel (the model's front end, before the per-utterance normalisation) and the posteriors
        (the softmax of the model's logits) come from the trained model, since the export has no
        signature for them.

        Returns:
            ``classes`` (each class's label: ``blank``, ``space``, the characters), ``mel_step`` and
            ``frame_step`` (seconds between log-mel frames and between output frames), and per
            utterance ``i``: ``log_mel/i`` [frames, n_mels], ``posteriors/i`` [output frames, classes],
            ``words/i``, ``start/i``, ``end/i``, ``confidence/i`` [words], ``transcript/i`` (the reference)
            and ``seconds/i`` (its duration).
        """
        rate = data.state["sample_rate"]
        waveforms = [inputs["waveform"].numpy() for inputs, _ in data.test.take(REPORT_UTTERANCES)]
        rows = audio.signature_rows(waveforms, rate, wav=False)
        timed = export("words", rows)
        log_mel = tf.cast(model.frontend(rows["waveform"], lengths=rows["length"]), tf.float32).numpy()
        posteriors = tf.nn.softmax(tf.cast(model(rows, training=False), tf.float32), axis=-1).numpy()
        frames = model.frontend.frame_lengths(rows["length"]).numpy()
        output_frames = model.output_lengths(rows["length"]).numpy()
        labels = {"": "blank", " ": "space"}
        arrays: dict[str, np.ndarray] = {"classes": np.array([labels.get(c, c) for c in data.state["chars"]]),
                                         "mel_step": np.float32(config.hop_length / rate),
                                         "frame_step": np.float32(model.seconds_per_frame)}
        for i, length in enumerate(rows["length"]):
            count = int(timed["num_words"][i])
            arrays.update({f"log_mel/{i}": log_mel[i, :frames[i]], f"posteriors/{i}": posteriors[i, :output_frames[i]],
                           f"words/{i}": np.array([w.decode("utf-8") for w in timed["words"][i, :count]]),
                           **{f"{key}/{i}": timed[key][i, :count] for key in ("start", "end", "confidence")},
                           f"transcript/{i}": np.array(data.arrays["test"]["transcripts"][i]),
                           f"seconds/{i}": np.float32(length / rate)})
        return arrays

    def report_sections(self, result: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[Section]:
        """Word timings over the log-mel and posteriors (``word-timings``); CER and WER per test set
        (``per-test-set``) and per voice (``per-voice``)."""
        timings: list[Block] = [Text("The log-mel (top) and the CTC posteriors of each class (bottom) of a few test "
                                     "utterances, with the words and times of the export's words signature over both "
                                     "(the log-mel and the posteriors are the trained model's).")]
        count = sum(1 for name in arrays if name.startswith("posteriors/"))
        timings += [_timing_figure(arrays, i) for i in range(count)] or [
            Text("(no report data: the figures are drawn from what the run saved)")]
        return [Section("Word timings", timings, anchor="word-timings"),
                *(_grouped_section(result, *group) for group in GROUPS)]

    def limits(self, config: SpeechRecognitionConfig, data: Splits) -> Limits:
        samples = int(config.max_seconds * data.state["sample_rate"])
        # a WAV of max_seconds at up to 48 kHz, 16-bit stereo, plus its header
        return Limits(max_batch_size=64, max_audio_samples=samples,
                      max_string_bytes=int(config.max_seconds * 48000 * 4) + 4096)

    def predict_inputs(self, state: dict[str, Any], inputs: list[str], signature: Any) -> dict[str, np.ndarray]:
        """Reads audio files (any rate and format ``read_audio`` reads); long ones are cut at silences.

        A file longer than ``max_seconds`` (saved in the state) becomes several rows, cut by
        ``speech.split_at_silences``; ``INPUT_INDEX`` names each row's file, so that
        ``format_prediction`` joins their transcripts. The rows are ``audio.signature_rows``: a
        zero-padded batch, or WAV bytes for ``wav_bytes``.
        """
        if not inputs:
            raise DataError("expected one or more audio files")
        rate, max_samples = int(state["sample_rate"]), int(state["max_seconds"] * state["sample_rate"])
        pieces, index = [], []
        for number, name in enumerate(inputs):
            cut = speech.split_at_silences(audio.read_audio(name, rate), max_samples, rate)
            pieces += cut
            index += [number] * len(cut)
        return {**audio.signature_rows(pieces, rate, wav="wav" in signature.inputs), INPUT_INDEX: np.array(index)}

    def format_prediction(self, state: dict[str, Any], inputs: dict[str, np.ndarray],
                          outputs: dict[str, np.ndarray], signature: str = "serving_default",
                          given: Sequence[str] = ()) -> tuple[str, Any]:
        """Joins the pieces of each file: transcripts with spaces, or word lists with their times shifted."""
        count = len(next(iter(outputs.values())))
        files = row_inputs(given, inputs, count)
        index = inputs.get(INPUT_INDEX, np.arange(count))
        offsets = np.zeros(count)
        for i in range(1, count):  # each piece starts where the one before it ended
            if index[i] == index[i - 1]:
                offsets[i] = offsets[i - 1] + inputs["length"][i - 1] / state["sample_rate"]
        rows: dict[int, dict[str, Any]] = {}
        for i, name in enumerate(files):
            row = rows.setdefault(int(index[i]), {"file": name, "pieces": 0})
            row["pieces"] += 1
            if "transcript" in outputs:
                text = outputs["transcript"][i].decode("utf-8")
                row["transcript"] = " ".join(t for t in (row.get("transcript", ""), text) if t)
                row["score"] = round(row.get("score", 0.0) + float(outputs["score"][i]), 3)
            else:
                row.setdefault("words", []).extend(
                    {"word": outputs["words"][i][j].decode("utf-8"),
                     "start": round(float(outputs["start"][i][j] + offsets[i]), 3),
                     "end": round(float(outputs["end"][i][j] + offsets[i]), 3),
                     "confidence": round(float(outputs["confidence"][i][j]), 3)}
                    for j in range(int(outputs["num_words"][i])))
        lines = [f"{row['file']}: " + (
            f"{predictions.said(row['transcript'], 'transcript')}  (score {row['score']:.3f})" if "transcript" in row
            else " ".join(f"{w['word']}[{w['start']:.2f}-{w['end']:.2f}]" for w in row["words"]) or "(no words)")
            for row in rows.values()]
        return "\n".join(lines), {"predictions": list(rows.values())}


def _timing_figure(arrays: dict[str, np.ndarray], index: int) -> Figure:
    """Utterance ``index`` of ``report_data``: the log-mel over the posteriors, on one time axis, the words on both."""
    seconds, words = float(arrays[f"seconds/{index}"]), arrays[f"words/{index}"]
    starts, ends = arrays[f"start/{index}"], arrays[f"end/{index}"]
    figure, (top, bottom) = plots.canvas(2, 1, height=3.2, sharex=True, gridspec_kw={"height_ratios": [2, 3]})
    log_mel, posteriors = arrays[f"log_mel/{index}"], arrays[f"posteriors/{index}"]
    plots.heatmap("log_mel", "log-mel", log_mel.T[::-1], ylabel="mel band", colorbar="log energy", axes=top)
    plots.heatmap("posteriors", "CTC posteriors", posteriors.T, y_labels=list(arrays["classes"]), xlabel="seconds",
                  colorbar="posterior", axes=bottom)
    # both panels in seconds: a log-mel frame is centred on its time, an output frame k spans [k, k + 1) steps
    mel_step, frame_step = float(arrays["mel_step"]), float(arrays["frame_step"])
    top.images[0].set_extent((-mel_step / 2, (len(log_mel) - 0.5) * mel_step, log_mel.shape[1] - 0.5, -0.5))
    top.set_yticks([])
    bottom.images[0].set_extent((0.0, len(posteriors) * frame_step, posteriors.shape[1] - 0.5, -0.5))
    bottom.set_xlim(0.0, seconds)
    for word, start, end in zip(words, starts, ends):
        for axes in (top, bottom):
            axes.axvspan(start, end, ymin=0.0, ymax=1.0, facecolor="none", edgecolor="white", linewidth=0.8)
        top.text((start + end) / 2, 0.96, word, transform=top.get_xaxis_transform(), ha="center", va="top",
                 color="white", fontsize="x-small")
    recognised = " ".join(words) or "(no words)"
    return plots.to_figure(f"word_timings_{index}", figure,
                           f"reference: {arrays[f'transcript/{index}']} | recognised words: {recognised} "
                           f"({seconds:.2f} s)")


#: The report's tables of error rates by group: (metrics key, row label, heading, anchor, what a row holds).
GROUPS = (("test_sets", "{}", "CER and WER per test set", "per-test-set",
           "each test set, named by its engine and voice: held-out voices of a trained engine, or an engine "
           "training never used"),
          ("per_voice", "voice {}", "CER and WER per held-out voice", "per-voice",
           "the test split per voice (never heard in training)"))


def _grouped_section(result: dict[str, Any], key: str, label: str, heading: str, anchor: str,
                     caption: str) -> Section:
    """CER and WER per group of test utterances (the run's ``test_sets`` or ``per_voice`` metrics) beside the
    baselines, as a table and bars.

    Args:
        result: the run result.
        key: the metrics' key.
        label: the row label of a group (``str.format`` of its name).
        heading, anchor: the section's.
        caption: what a row of the table holds.
    """
    groups = result.get("metrics", {}).get(key)
    if not groups:
        return Section(heading, [Text(
            "(no voice per utterance: the run's data names no speakers, as the generated corpus does)")],
            anchor=anchor)
    headlines = SpeechRecognition.headline_metrics
    utterances = {label.format(name): values["utterances"] for name, values in groups.items()}
    utterances[ALL_VOICES] = sum(utterances.values())
    shown = {**{label.format(name): [h.value(values) for h in headlines] for name, values in groups.items()},
             ALL_VOICES: [h.value(result["metrics"]) for h in headlines],
             **{f"baseline: {name.replace('_', ' ')}": [h.value(values, baseline=True) for h in headlines]
                for name, values in result.get("baseline", {}).items()}}
    table = Table(["", "utterances", *(h.title() for h in headlines)],
                  [[name, utterances.get(name), *cells] for name, cells in shown.items()],
                  caption=f"{caption}, and all of it beside the baselines (a baseline has one transcript per "
                          "utterance: greedy and beam alike)")
    chart = plots.bar_chart(f"{key}_error_rates",
                            heading.replace("CER and WER", "error rates"),
                            {h.title(): {textwrap.fill(name, 18): cells[k] for name, cells in shown.items()
                                         if cells[k] is not None} for k, h in enumerate(headlines)}, "%",
                            caption=f"CER and WER of greedy and beam decoding: {caption}; over all test "
                                    "utterances, and of the baselines")
    return Section(heading, [table, chart], anchor=anchor)


def _word_timing_error(data: Splits, found: dict[str, list]) -> dict[str, float]:
    """Mean absolute error of the greedy words' start times against the synthesiser's word times.

    Only test utterances whose greedy transcript is right and whose engine gives word times
    (espeak-ng's word events, Festival's Word relation; not Flite) are scored, and in them only
    the words that start an espeak-ng event group (words sharing their neighbour's event
    have no known start).
    """
    errors = []
    for path, truth, hypothesis, starts in zip(data.arrays["test"]["paths"], data.arrays["test"]["transcripts"],
                                               found["greedy"], found["starts"]):
        spans = data.arrays["words"].get("/".join(Path(path).parts[-2:]))
        if hypothesis != truth or spans is None:  # Flite gives no word times
            continue
        known = [start for group, start, _ in spans for start in [start] + [None] * group.count(" ")]
        errors += [abs(found_start - start) for found_start, start in zip(starts, known) if start is not None]
    return {"word_start_mae_s": float(np.mean(errors)) if errors else None, "timed_words": len(errors)}


def _language_model(config: SpeechRecognitionConfig, transcripts: Sequence[str],
                    chars: Sequence[str]) -> ngram_lm.CharNgramLM | None:
    """The character n-gram model of the training transcripts that the beam search reads; None for ``lm_order=0``.

    Raises:
        ConfigError: ``lm_order`` too high for the number of characters (its keys would not fit an int64).
    """
    if not config.lm_order:
        return None
    highest = ngram_lm.max_order(len(chars))
    if config.lm_order > highest:
        raise ConfigError(f"config field 'lm_order': got {config.lm_order}, expected at most {highest} for "
                          f"{len(chars) - 1} characters")
    return ngram_lm.CharNgramLM(transcripts, chars, config.lm_order, name="language_model")


def _fusion(data: Splits) -> tuple[float, float] | None:
    """The calibrated ``(weight, bonus)`` of the language model in the beam search.

    None without a language model (``lm_order=0``; an export's state may still hold an earlier run's pair) or
    when ``(0, 0)`` was chosen: then the plain CTC beam search serves, and the export holds no language model.
    """
    if data.arrays.get("language_model") is None or "lm_weight" not in data.state:
        return None
    fusion = (float(data.state["lm_weight"]), float(data.state["lm_bonus"]))
    return fusion if any(fusion) else None


def _sources(texts: Sequence[str]) -> list[speech.Source]:
    """The sources of a config's list, or [] when one of them is not ``engine`` or ``engine:voice``."""
    try:
        return [speech.Source.parse(text) for text in texts]
    except DataError:
        return []


def _heard_in_training(test: speech.Source, sources: Sequence[speech.Source]) -> bool:
    """Whether training hears a test source: its engine with an overlapping voice (espeak-ng's default
    variants are held out by construction, ``speech.VARIANTS``)."""
    if test.engine == "espeak" and test.voice is None:
        return False
    for source in sources:
        if source.engine != test.engine:
            continue
        if test.engine == "espeak":
            variant = test.voice.partition("+")[2]
            if source.voice is None and variant in speech.VARIANTS["train"] or source.voice == test.voice:
                return True
        elif source.voice is None or test.voice is None or source.voice == test.voice:
            return True
    return False


def _test_set_title(test: speech.Source, sources: Sequence[str]) -> str:
    """A test set as the summary and report name it: the engine, the voice and what training never heard."""
    engines = {source.engine for source in _sources(sources)}
    held_out = "held-out engine" if test.engine not in engines else (
        "held-out voice" if test.voice else "held-out voices")
    return f"{test.title()} ({held_out})"


def _read_clips(utterances: list[speech.Utterance], labels: list[list[int]],
                config: SpeechRecognitionConfig) -> tuple[np.ndarray, np.ndarray]:
    """Reads a split's audio as 16-bit PCM (half the memory of float32), every clip back to back.

    Clips are read and joined ``CLIPS_PER_READ`` at a time, so the peak holds the chunks and their join: two copies
    of the audio, never a list of every clip beside the join.

    Args:
        utterances: the split's rows.
        labels: each row's character ids.
        config: ``max_seconds`` and the front end's frame rate.

    Returns:
        ``(samples, lengths)``: int16 [total samples] and each clip's int32 length.

    Raises:
        DataError: naming the table line, when a clip cannot be read or is too short for its transcript.
    """
    chunks, lengths = [], []
    for start in range(0, len(utterances), CLIPS_PER_READ):
        chunk = utterances[start:start + CLIPS_PER_READ]
        clips = []
        for utterance, waveform in zip(chunk, speech.load_waveforms(chunk, config.max_seconds)):
            if _ctc_frames_needed(labels[start + len(clips)]) > _output_frames(config, waveform.size):
                raise DataError(f"{utterance.where}: the transcript ({len(utterance.transcript)} characters) "
                                f"is too long for {waveform.size / speech.SAMPLE_RATE:.2f} s of audio at "
                                f"{1000 * config.stride * config.hop_length / speech.SAMPLE_RATE:g} ms "
                                "per output frame; check the line, or lower stride")
            clips.append(np.round(np.clip(waveform, -1.0, 1.0) * 32767).astype(np.int16))
        chunks.append(np.concatenate(clips) if clips else np.zeros(0, np.int16))
        lengths += [clip.size for clip in clips]
    samples = np.concatenate(chunks) if chunks else np.zeros(0, np.int16)
    return samples, np.array(lengths, np.int32)


def _to_float(clip: tuple[tf.Tensor, tf.Tensor], labels: tf.Tensor) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    pcm, length = clip
    return {"waveform": tf.cast(pcm, tf.float32) / 32767.0, "length": length}, labels
