"""Image captioning: a CNN encoder and an attending RNN decoder, trained end to end (Vinyals et al. 2015,
"Show and Tell"; Xu et al. 2015, "Show, Attend and Tell"; Karpathy and Fei-Fei 2015).

Model: a small convnet trained from scratch (or a Keras Applications backbone, ``cnn=MobileNetV3Small``,
with local weights from ``cnn_weights=PATH``, frozen or fine-tuned) turns the image into a feature map.
Its average, through a tanh layer, is the decoder's initial state; the ``AttentionDecoder`` attends over
the feature-map grid at every word (``attention=none`` for plain Show and Tell) and ``BatchNCE`` scores
the words (``output=softmax|bnce``; evaluation and serving use the full softmax). ``decoder_inputs=roles`` makes the
decoder compositional: the colour words share one input embedding (so do the shape words, and their plurals), so
the decoder knows that it said a colour but not which. ``image_streams=colour_shape``, the default preset's,
factorises the image features: the convnet reads a colour-blind grey view (a random mix of the channels per training
image, ``RandomChannelMix``), so its features cannot tie a shape to the colours it was seen in, and 1 x 1
convolutions beside it read each pixel's colour. On ``test_novel`` the streams raised fact accuracy 2.5x at a reduced
size and the roles decoder did not help (docs/results.md, "Colour and shape read apart"). ``shape_view=local_contrast``
makes the shape stream read the grey view's local contrast (``LocalContrastNorm``): edges without the background's
level. It raised the held-out style's BLEU-4 at two seeds but not its fact accuracy, and it cost the seen style's,
so it is off by default (docs/results.md, "Beating the nearest neighbour on the held-out style").

Data: by default generated scenes of 1-3 coloured shapes with their true captions
(``seqapps.data.scenes``), written once from the seed into ``$SEQAPPS_DATA`` (default
``~/.cache/seqapps``). Scenes with a held-out colour/shape pair form the second test split
``test_novel``; scenes of seen pairs drawn in a style training never saw (``scenes.PHOTO``: outlines on
photos, other sizes, overlapping, blurred, JPEG-compressed) form the third, ``test_style``.
``train_style=varied``, the default preset's, draws the training and validation scenes on procedural textures
with random blur and JPEG artefacts (``scenes.VARIED``, domain randomisation; never photos or outlines); the
test splits stay as they are. ``tiny`` and ``full`` keep ``flat``.
``--data folder/`` (or its ``captions.csv``) reads the user's ``image,caption`` rows.
Fine-tuning (``seqapps finetune image_captioning --from EXPORT --data folder/``) extends the export's
vocabulary with the training captions' new words seen ``min_count`` times (``vocabulary=extend``, the
default; ``adapt_model`` grows the decoder's embedding and the output layer with
``seqapps.finetuning.transfer_weights``); ``vocabulary=keep`` keeps it, new words becoming ``<unk>``.

Metrics: BLEU-1 to BLEU-4 (sacrebleu, all references) for greedy and beam search on ``test``,
``test_novel`` and ``test_style``, and, for generated scenes (or a folder whose ``scenes.csv``
``scenes.write_scenes`` wrote), the share of captions whose facts are all true (``scenes.check_caption``).
Baselines: the most frequent training caption, and the caption of the nearest training image in the trained
CNN's pooled-feature space.

Report (``report.html``): a few images of each test split with the export's greedy and beam captions, one
picture per caption word with its attention over the image, and fact accuracy and BLEU-4 per split (seen
and novel colour/shape pairs, seen and held-out style) beside the baselines.

Export: ``serving_default`` takes ``image_bytes`` (string ``[batch]``: JPEG, PNG, GIF or BMP of any size,
grayscale or RGBA; decoded, resized and scaled in the graph by ``seqapps.data.images.decode_images``)
and returns ``caption`` and ``score`` (log-probability per word, end included); ``beam`` returns
``captions``/``scores`` ``[batch, beam_size]``; ``attention`` returns the greedy caption, its ``words``
and ``attention`` ``[batch, T, grid_height * grid_width]`` over the feature map, collected while
decoding. Each decoding strategy registered in ``seqapps.generation.STRATEGIES`` adds a signature shaped
as ``serving_default`` (one hypothesis) or ``beam`` (several).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import math
from pathlib import Path
from typing import Any, ClassVar, Sequence

import keras
import numpy as np
import tensorflow as tf

from seqapps import metrics as seqapps_metrics
from seqapps import predictions
from seqapps.config import Seq2SeqConfig, require, require_split_fractions
from seqapps.data import captions as caption_data
from seqapps.data import datasets
from seqapps.data import images as image_data
from seqapps.data import samples, scenes
from seqapps.data import splits as split_rule
from seqapps.data import text as text_data
from seqapps.data.files import data_home
from seqapps.errors import ConfigError
from seqapps.export import ExportCalls, Limits, ServingModule, Signature
from seqapps.finetuning import VOCABULARY_CHOICES, VocabularyMap, grow_vocabulary, transfer_weights, vocabulary_report
from seqapps.generation import (Generation, Generator, evaluation_decoder, generate_texts, strategy_signatures,
                                unicode_texts)
from seqapps.layers.attention_decoder import AttentionDecoder, PaddingMask
from seqapps.layers.decoding import BeamSearch, DecodingStrategy, GreedySearch
from seqapps.layers.batch_nce import BatchNCE, unigram_distribution
from seqapps.layers.image_streams import LocalContrastNorm, RandomChannelMix
from seqapps.losses import per_token_training_loss
from seqapps.pipeline import SPLIT_COUNTS, VOCABULARIES, Headline, Pipeline, Splits, row_inputs
from seqapps.report import plots
from seqapps.report.document import Section, Table, Text
from seqapps.training import training_tokens_per_second

END = text_data.END_OF_SENTENCE
START = "<s>"
END_ID, START_ID = 1, 2  # ids right after <unk>; END also pads
TOKENIZER = text_data.Tokenizer("word")
SCENES_VERSION = 2  # bump when the generator changes, so cached scenes are written again
SAMPLES = 5
REPORT_IMAGES = 6  # test images the report shows, shared between test and test_novel
ATTENTION_WORDS = 12  # the most caption words whose attention map the report shows, per image
# split -> what the report calls it
DECODER_INPUTS = ("words", "roles")  # what the decoder reads of each previous word
IMAGE_STREAMS = ("joint", "colour_shape")  # one convnet over RGB, or a colour-blind shape stream beside a colour one
SHAPE_VIEWS = ("grey", "local_contrast")  # what the colour-blind shape stream reads
COLOUR_STREAM_FILTERS = 16
TEST_SPLITS = {"test": "seen (test)", "test_novel": "novel (test_novel)", "test_style": "held-out style (test_style)"}


@dataclasses.dataclass
class CaptioningConfig(Seq2SeqConfig):
    """Captioning settings; the decoder's and its generator's are ``Seq2SeqConfig``'s.

    Attributes:
        num_train, num_val, num_test, num_novel, num_style: generated scenes per split (``test_novel`` holds
            the held-out colour/shape pairs, ``test_style`` seen pairs drawn in the held-out style).
        val_fraction, test_fraction: shares of the user's images held out (by image).
        image_size: images are resized to ``image_size x image_size`` pixels.
        cnn: "small" (a convnet trained from scratch) or a ``keras.applications`` class name.
        cnn_filters: filters of the small convnet's blocks (each halves the grid).
        cnn_weights: a local weights file for a Keras Applications backbone (None: random weights).
        cnn_trainable: fine-tune the backbone (False: frozen).
        max_caption_length: the most words of a training caption (longer ones are cut) and of a generated one.
        min_count: rarer caption words map to ``<unk>`` (at fine-tuning: new words rarer than this are not added).
        vocabulary: at fine-tuning, "extend" adds the new words of the training captions to the export's
            vocabulary, "keep" keeps the export's (new words become ``<unk>``).
        max_eval_images: caption at most this many images per test split (None: all).
        decoder_inputs: "words" (the decoder reads each previous word) or "roles" (the colour words share
            one input embedding, the shape words one and their plurals one, ``scenes.WORD_ROLES``: the
            decoder knows that it said a colour, and the attention says which).
        image_streams: "joint" (the small convnet reads the RGB image) or "colour_shape" (it reads a
            colour-blind grey view, ``RandomChannelMix``, and 1 x 1 convolutions beside it read each pixel's
            colour, max-pooled to the same grid: shape features that cannot tie a shape to a colour).
        shape_view: what the shape stream of ``image_streams=colour_shape`` reads: "grey" (the colour-blind
            view) or "local_contrast" (its local contrast, ``LocalContrastNorm`` with a Gaussian of 4 px at
            64 px: edges without the background's level).
        train_style: how generated training and validation scenes are drawn: "flat" (plain grey) or "varied"
            (``scenes.VARIED``: textures, blur and JPEG artefacts). The user's own images are read as they are.
    """

    num_train: int = 4000
    num_val: int = 300
    num_test: int = 500
    num_novel: int = 500
    num_style: int = 500
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    image_size: int = 64
    cnn: str = "small"
    cnn_filters: list[int] = dataclasses.field(default_factory=lambda: [32, 64, 96])
    cnn_weights: str | None = None
    cnn_trainable: bool = True
    max_caption_length: int = 24
    min_count: int = 1
    vocabulary: str = "extend"
    max_eval_images: int | None = None
    decoder_inputs: str = "words"
    image_streams: str = "joint"
    shape_view: str = "grey"
    train_style: str = scenes.FLAT.name
    batch_size: int = 64
    learning_rate: float = 2e-3
    epochs: int = 10
    early_stopping_patience: int = 3
    lr_patience: int = 1

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {**Seq2SeqConfig.CHOICES, "decoder_inputs": DECODER_INPUTS,
                                                   "image_streams": IMAGE_STREAMS, "shape_view": SHAPE_VIEWS,
                                                   "train_style": scenes.TRAINING_STYLES}
    PRESETS = {
        "tiny": {"num_train": 120, "num_val": 20, "num_test": 20, "num_novel": 20, "num_style": 20,
                 "image_size": 32,
                 "cnn_filters": [8, 16], "embedding_dim": 8, "units": 16, "epochs": 1, "steps_per_epoch": 6,
                 "batch_size": 16, "beam_size": 2, "max_eval_images": 10, "timing_steps": 0},
        # colour and shape read apart: test_novel fact accuracy 0.81 against 0.41 for the joint convnet
        # (docs/results.md, "Colour and shape read apart"); varied backgrounds, blur and JPEG in training: the
        # held-out style 0.07 against 0.008, test_novel 0.77 (docs/results.md, "Training on varied backgrounds")
        "default": {"image_streams": "colour_shape", "train_style": scenes.VARIED.name},
        "full": {"image_size": 224, "cnn": "MobileNetV3Small", "units": 512, "embedding_dim": 256, "epochs": 30},
    }

    def validate(self) -> None:
        super().validate()
        for name in ("num_train", "num_val", "num_test", "num_novel", "num_style", "image_size",
                     "max_caption_length", "min_count"):
            require(getattr(self, name) >= 1, name, getattr(self, name), "an integer >= 1")
        require(self.cnn == "small" or hasattr(keras.applications, self.cnn), "cnn", self.cnn,
                "small or a keras.applications class name (e.g. MobileNetV3Small)")
        require(bool(self.cnn_filters) and all(f >= 1 for f in self.cnn_filters), "cnn_filters", self.cnn_filters,
                "a non-empty list of integers >= 1")
        require(self.image_size >= 2 ** len(self.cnn_filters), "image_size", self.image_size,
                f"at least 2 ** len(cnn_filters) = {2 ** len(self.cnn_filters)}")
        require(self.image_streams == "joint" or self.cnn == "small", "image_streams", self.image_streams,
                "joint with a keras.applications backbone (colour_shape needs cnn=small)")
        require(self.shape_view == "grey" or self.image_streams == "colour_shape", "shape_view", self.shape_view,
                "grey unless image_streams=colour_shape (only the shape stream reads it)")
        require(self.cnn_weights is None or Path(self.cnn_weights).is_file(), "cnn_weights", self.cnn_weights,
                "null or an existing local weights file")
        require(self.vocabulary in VOCABULARY_CHOICES, "vocabulary", self.vocabulary,
                f"one of {', '.join(VOCABULARY_CHOICES)}")
        require(self.max_eval_images is None or self.max_eval_images >= 1, "max_eval_images",
                self.max_eval_images, "null or >= 1")
        require_split_fractions(self.val_fraction, self.test_fraction)


def scene_splits(config: CaptioningConfig) -> dict[str, caption_data.CaptionedImages]:
    """Generated scenes for train/val/test (no held-out pair), test_novel (at least one) and test_style (no
    held-out pair, drawn in the held-out style ``scenes.PHOTO``), from the seed. train and val are drawn in
    ``config.train_style``, test and test_novel in ``scenes.FLAT``."""
    counts = {"train": config.num_train, "val": config.num_val, "test": config.num_test,
              "test_novel": config.num_novel, "test_style": config.num_style}
    styles = {"train": scenes.STYLES[config.train_style], "val": scenes.STYLES[config.train_style],
              "test_style": scenes.PHOTO}
    found = {}
    for offset, (name, count) in enumerate(counts.items()):
        style = styles.get(name, scenes.FLAT)
        suffix = "" if style in (scenes.FLAT, scenes.PHOTO) else f"-{style.name}"
        folder = (data_home() / "scenes"
                  / f"v{SCENES_VERSION}-{name}-{count}-seed{config.seed}-{config.image_size}px{suffix}")
        csv_path = scenes.write_scenes(folder, count, seed=config.seed * 10 + offset, held_out=name == "test_novel",
                                       image_size=config.image_size, style=style)
        found[name] = caption_data.read_captions(csv_path, check_images=False)
    return found


def user_splits(config: CaptioningConfig, data_path: str) -> dict[str, caption_data.CaptionedImages]:
    """The user's images, split by image (``seqapps.data.splits``: a permutation seeded by ``config.seed``)."""
    read = caption_data.read_captions(datasets.tfds_caption_folder(data_path) if datasets.is_tfds(data_path)
                                      else data_path)
    labels = split_rule.assign_splits(len(read), config.val_fraction, config.test_fraction, read.source, "images",
                                      "shuffle", config.seed)
    return {name: caption_data.CaptionedImages([read.images[i] for i in part], [read.captions[i] for i in part],
                                               read.source) for name, part in split_rule.split_indices(labels).items()}


def decode_files(paths: Sequence[Path], image_size: int, source: str, batch_size: int = 256) -> np.ndarray:
    """Reads and decodes image files as the export does (``decode_images``), as uint8 ``[N, size, size, 3]``."""
    encoded = [image_data.read_image_bytes(path, source) for path in paths]
    out = np.zeros((len(encoded), image_size, image_size, 3), "uint8")
    for start in range(0, len(encoded), batch_size):
        batch = image_data.decode_images(tf.constant(encoded[start: start + batch_size]), image_size, image_size,
                                         max_request_pixels=None)
        out[start: start + batch_size] = np.clip(np.round(batch.numpy()), 0, 255).astype("uint8")
    return out


def role_ids(vocabulary: Sequence[str]) -> list[int]:
    """For each word, the id whose input embedding it reads: the first word of its role (``scenes.WORD_ROLES``),
    else its own (a grown vocabulary appends words, so an export's words keep their ids)."""
    first: dict[str, int] = {}
    return [first.setdefault(scenes.WORD_ROLES[word], i) if word in scenes.WORD_ROLES else i
            for i, word in enumerate(vocabulary)]


def most_frequent(captions_per_image: Sequence[Sequence[str]]) -> str:
    """The most frequent training caption (ties: the first seen)."""
    counts = collections.Counter(caption for group in captions_per_image for caption in group)
    return counts.most_common(1)[0][0]


def nearest_neighbour(train_features: np.ndarray, train_captions: Sequence[Sequence[str]],
                      features: np.ndarray) -> list[str]:
    """The first caption of the closest training image (cosine distance) for each row of ``features``."""
    from sklearn.neighbors import NearestNeighbors

    index = NearestNeighbors(n_neighbors=1, metric="cosine").fit(train_features)
    return [train_captions[i][0] for i in index.kneighbors(features, return_distance=False)[:, 0]]


class ImageCaptioning(Pipeline):
    """CNN encoder + attending LSTM/GRU decoder, from image bytes to a caption."""

    Config = CaptioningConfig
    predict_input = "image files (JPEG, PNG, GIF or BMP), one per row; --signature beam or attention"
    predict_rows_per_call = image_data.IMAGES_PER_CALL  # within the graph's pixel budget of one call

    # --- data -------------------------------------------------------------------------------

    headline_metrics = (Headline("test/greedy_bleu4", "BLEU-4 greedy", baseline_key="test/bleu4"),
                        Headline("test/beam_bleu4", "BLEU-4 beam", baseline_key="test/bleu4"),
                        Headline("test/beam_fact_accuracy", "facts right", "%", 100.0,
                                 baseline_key="test/fact_accuracy"),
                        Headline("test_novel/beam_bleu4", "novel BLEU-4", baseline_key="test_novel/bleu4"),
                        Headline("test_novel/beam_fact_accuracy", "novel facts right", "%", 100.0,
                                 baseline_key="test_novel/fact_accuracy"),
                        Headline("test_style/beam_bleu4", "held-out style BLEU-4", baseline_key="test_style/bleu4"),
                        Headline("test_style/beam_fact_accuracy", "held-out style facts right", "%", 100.0,
                                 baseline_key="test_style/fact_accuracy"))

    def write_sample_data(self, folder: Path, seed: int = 0) -> tuple[str | None, list[str]]:
        """24 photos of temples and flowers with two captions each, words the generated scenes lack."""
        _, images = samples.write_shape_images(folder / "photos", 24, seed)
        return str(folder / "photos"), [str(images[0]), str(images[3])]

    def load_data(self, config: CaptioningConfig, data_path: str | None,
                  state: dict[str, Any] | None = None) -> Splits:
        parts = user_splits(config, data_path) if data_path else scene_splits(config)
        tokens = {name: [[TOKENIZER.tokenize(c)[: config.max_caption_length] for c in group] for group in part.captions]
                  for name, part in parts.items()}
        words = [word for group in tokens["train"] for caption in group for word in caption]
        exported_words = len(state["vocabulary"]) if state else None  # fine-tuning: the export's vocabulary
        if state is None:
            vocabulary = text_data.build_vocabulary(words, min_count=config.min_count, reserved=[END, START])
            state = {"vocabulary": vocabulary.tokens, "image_size": config.image_size,
                     "max_caption_length": config.max_caption_length, "beam_size": config.beam_size,
                     "length_penalty": config.length_penalty}
        elif config.vocabulary == "extend":
            state = {**state, "vocabulary": grow_vocabulary(state["vocabulary"], words, config.min_count)}
        vocabulary = text_data.Vocabulary(state["vocabulary"], [0] * len(state["vocabulary"]))
        pixels = {name: decode_files(part.images, state["image_size"], part.source) for name, part in parts.items()}
        width = state["max_caption_length"] + 1
        datasets_, counts = {}, np.zeros(len(vocabulary), "int64")
        for name in ("train", "val", "test"):
            image_index, target_in, target_out, weights = [], [], [], []
            for i, group in enumerate(tokens[name]):
                for caption in group:
                    ids = vocabulary.encode(caption)
                    image_index.append(i)
                    target_in.append(np.r_[START_ID, ids, [END_ID] * (width - 1 - len(ids))])
                    target_out.append(np.r_[ids, [END_ID] * (width - len(ids))])
                    weights.append(np.arange(width) <= len(ids))
            target_out_array, weights_array = np.array(target_out, "int32"), np.array(weights, "float32")
            if name == "train":
                counts = np.bincount(target_out_array[weights_array > 0], minlength=len(vocabulary))
            datasets_[name] = tf.data.Dataset.from_tensor_slices((
                {"image": pixels[name][np.array(image_index)], "target_in": np.array(target_in, "int32"),
                 "target_out": target_out_array}, np.zeros_like(weights_array), weights_array))
        truths = {name: scenes.read_scenes(Path(part.source).parent) for name, part in parts.items()
                  if (Path(part.source).parent / scenes.SCENES_FILE).is_file()}
        report = {"source": "generated scenes (seqapps.data.scenes)" if not data_path else parts["train"].source,
                  "images": {name: len(part) for name, part in parts.items()},
                  SPLIT_COUNTS: split_rule.split_counts("images", {name: len(part) for name, part in parts.items()}),
                  "captions": {name: sum(len(group) for group in part.captions) for name, part in parts.items()},
                  "vocabulary": len(vocabulary),
                  VOCABULARIES: {"words": vocabulary_report(
                      exported_words or len(vocabulary), vocabulary.tokens,
                      (word for group in tokens["test"] for caption in group for word in caption))}}
        return Splits(datasets_["train"], datasets_["val"], datasets_["test"], state=state, report=report,
                      arrays={"parts": parts, "pixels": pixels, "target_counts": counts, "truths": truths})

    # --- model ------------------------------------------------------------------------------

    def _cnn(self, config: CaptioningConfig, image: keras.KerasTensor) -> keras.KerasTensor:
        if config.cnn == "small":
            pixels = keras.layers.Rescaling(1 / 255.0, name="rescale")(image)
            hidden = pixels
            if config.image_streams == "colour_shape":
                hidden = RandomChannelMix(seed=config.seed, name="colour_blind")(pixels)
                if config.shape_view == "local_contrast":
                    hidden = LocalContrastNorm(sigma=4.0 * config.image_size / 64, name="local_contrast")(hidden)
            for i, filters in enumerate(config.cnn_filters):
                hidden = keras.layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"conv_{i + 1}a")(hidden)
                hidden = keras.layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"conv_{i + 1}b")(hidden)
                hidden = keras.layers.MaxPooling2D(name=f"pool_{i + 1}")(hidden)
            if config.image_streams == "joint":
                return hidden
            colour = pixels
            for i in range(2):
                colour = keras.layers.Conv2D(COLOUR_STREAM_FILTERS, 1, activation="relu", name=f"colour_{i + 1}")(colour)
            colour = keras.layers.MaxPooling2D(2 ** len(config.cnn_filters), name="colour_pool")(colour)
            return keras.layers.Concatenate(name="streams")([hidden, colour])
        backbone_class = getattr(keras.applications, config.cnn)
        try:
            backbone = backbone_class(include_top=False, weights=None,
                                      input_shape=(config.image_size, config.image_size, 3))
        except ValueError as error:
            raise ConfigError(f"config field 'cnn': {config.cnn} cannot take {config.image_size}px images "
                              f"({str(error).splitlines()[0]})") from None
        if config.cnn_weights:
            try:
                backbone.load_weights(config.cnn_weights, skip_mismatch=False)
            except (ValueError, OSError) as error:
                raise ConfigError(f"config field 'cnn_weights': {config.cnn_weights} does not fit {config.cnn} "
                                  f"({str(error).splitlines()[0][:200]})") from None
        backbone.trainable = config.cnn_trainable
        # Keras Applications take 0..255 pixels and scale them themselves.
        return backbone(image, training=False if not config.cnn_trainable else None)

    def build_model(self, config: CaptioningConfig, data: Splits) -> keras.Model:
        vocab_size = len(data.state["vocabulary"])
        size = data.state["image_size"]
        image = keras.Input((size, size, 3), dtype="float32", name="image")
        target_in = keras.Input((None,), dtype="int32", name="target_in")
        target_out = keras.Input((None,), dtype="int32", name="target_out")
        grid = self._cnn(config, image)
        features = keras.layers.Reshape((-1, grid.shape[-1]), name="grid")(grid)
        memory = keras.layers.Dense(config.units, name="memory")(features)
        pooled = keras.layers.GlobalAveragePooling1D(name="pooled")(features)
        initial_state = [keras.layers.Dense(config.units, activation="tanh", name=f"init_{k}")(pooled)
                         for k in range(2 if config.cell == "lstm" else 1)]
        decoder = AttentionDecoder(vocab_size, config.embedding_dim, config.units, cell=config.cell,
                                   attention=config.attention, dropout=config.dropout,
                                   input_ids=role_ids(data.state["vocabulary"]) if config.decoder_inputs == "roles"
                                   else None, name="decoder")
        hidden = decoder({"ids": target_in, "memory": memory, "state": initial_state})
        output = BatchNCE(vocab_size, loss=config.output, log_z=config.log_z, extra_noise=config.extra_noise,
                          noise_scope=config.noise_scope, compact_batch=True, seed=config.seed, name="output")
        # target_in is END from the token after target_out's END on: those tokens are padding, never noise
        per_token = output([hidden, target_out], target_mask=PaddingMask(END_ID, name="target_mask")(target_in))
        unigram = unigram_distribution(data.arrays["target_counts"])
        output.set_noise_distribution(unigram)
        output.bias.assign((np.log(unigram) + config.log_z).astype("float32"))
        return keras.Model({"image": image, "target_in": target_in, "target_out": target_out}, per_token,
                           name=self.name)

    def adapt_model(self, model: keras.Model, config: CaptioningConfig, data: Splits) -> keras.Model:
        """Grows the decoder's embedding and the output layer for the words ``load_data`` added (after the old).

        A changed ``output`` criterion also rebuilds the model.
        """
        words = data.state["vocabulary"]
        exported = model.get_layer("output").vocab_size
        if exported == len(words) and model.get_layer("output").loss == config.output:
            return model
        grown = self.build_model(config, data)
        mapping = VocabularyMap.from_tokens(words[:exported], words)
        transfer_weights(model, grown, {"decoder/embedding": mapping, "output": mapping})
        return grown

    def compile_args(self, config: CaptioningConfig, data: Splits) -> dict[str, Any]:
        return {"loss": per_token_training_loss}

    # --- evaluation -------------------------------------------------------------------------

    def evaluate(self, model: keras.Model, config: CaptioningConfig,
                 data: Splits) -> tuple[dict[str, float], dict[str, Any]]:
        key = json.dumps({name: data.state[name] for name in ("image_size", "max_caption_length", "vocabulary")})
        captioner, functions = evaluation_decoder(model, key, lambda: Captioner(model, data.state))
        parts, pixels = data.arrays["parts"], data.arrays["pixels"]
        train_captions = parts["train"].captions
        train_features = captioner.features(pixels["train"])
        frequent = most_frequent(train_captions)
        strategies = {"greedy": GreedySearch(), "beam": BeamSearch.from_request(data.state, {})}
        metrics: dict[str, Any] = {"parameters": int(model.count_params())}
        if config.timing_steps:
            metrics["train_tokens_per_s"] = training_tokens_per_second(
                model, config, self.compile_args(config, data), data)
        baselines: dict[str, dict[str, Any]] = {"most_frequent": {}, "nearest_neighbour": {}}
        for split in (name for name in TEST_SPLITS if name in parts):
            count = min(len(parts[split]), config.max_eval_images or len(parts[split]))
            images = pixels[split][:count]
            references = [[TOKENIZER.join(TOKENIZER.tokenize(c)) for c in group] for group in parts[split].captions[:count]]
            truths = data.arrays["truths"].get(split)
            names = [path.name for path in parts[split].images[:count]]
            found = dict(zip(strategies, captioner.caption_pixels(images, list(strategies.values()), functions)))
            neighbours = nearest_neighbour(train_features, train_captions, captioner.features(images))
            for name, hypotheses in found.items():
                metrics.update(_scores(references, hypotheses, truths, names, f"{split}/{name}_"))
            baselines["most_frequent"].update(_scores(references, [frequent] * count, truths, names, f"{split}/"))
            baselines["nearest_neighbour"].update(_scores(references, neighbours, truths, names, f"{split}/"))
            metrics[f"samples/{split}"] = [{"image": n, "references": r, "greedy": g, "beam": b}
                                           for n, r, g, b in zip(names, references, found["greedy"],
                                                                 found["beam"])][:SAMPLES]
        return metrics, baselines

    # --- export -----------------------------------------------------------------------------

    def serving_module(self, model: keras.Model, config: CaptioningConfig, data: Splits) -> ServingModule:
        """``serving_default`` (greedy), ``beam`` and every other strategy of ``seqapps.generation.STRATEGIES``,
        and ``attention``; the module owns the vocabulary (an asset file)."""
        captioner = Captioner(model, data.state)
        inputs = {"image_bytes": tf.TensorSpec([None], tf.string, name="image_bytes")}
        first = data.arrays["parts"]["test"].images[0]
        example = {"image_bytes": np.array([image_data.read_image_bytes(first)], dtype=object)}
        signatures = strategy_signatures(captioner.generator, captioner.generate, captioner.preprocess, data.state,
                                         inputs, example, ("caption", "captions"))
        signatures["attention"] = Signature(inputs=inputs, example=example, run=captioner.attention,
                                            preprocess=captioner.preprocess)
        return ServingModule(model, signatures, resources={"vocabulary": captioner.generator.lookup})

    def predict_inputs(self, state: dict[str, Any], inputs: list[str], signature: Any) -> dict[str, np.ndarray]:
        """``seqapps predict EXPORT photo.jpg ...``: each INPUT is an image file."""
        return {"image_bytes": np.array([image_data.read_image_bytes(path) for path in inputs], dtype=object)}

    def format_prediction(self, state: dict[str, Any], inputs: dict[str, np.ndarray],
                          outputs: dict[str, np.ndarray], signature: str = "serving_default",
                          given: Sequence[str] = ()) -> tuple[str, Any]:
        """Each image file with its caption: the greedy one (or another strategy's) and its score, the n-best
        list (``beam``, or a strategy's ``captions``), or, per word, the feature-map cell it attends to most
        (``attention``)."""
        files = row_inputs(given, inputs, len(inputs["image_bytes"]))
        if "captions" in outputs:
            return predictions.ranked_rows(files, files, outputs["captions"], outputs["scores"], "caption", "captions")
        found = [predictions.text(value) for value in outputs["caption"]]
        if signature == "attention":
            return _attended_cells(files, found, outputs)
        scores = [round(float(s), 4) for s in outputs["score"]]
        lines = [f"{name}: {predictions.said(caption, 'caption')}  (score {score:.3f})"
                 for name, caption, score in zip(files, found, scores)]
        return "\n".join(lines), {"inputs": files, "captions": found, "scores": scores}

    # --- report -----------------------------------------------------------------------------

    def report_data(self, model: keras.Model, config: CaptioningConfig, data: Splits,
                    export: ExportCalls) -> dict[str, np.ndarray]:
        """The first images of each test split, their files' bytes sent to the export's ``attention`` and ``beam``.

        Returns:
            ``pixels`` (uint8 ``[n, size, size, 3]``, decoded as the export decodes them), ``split`` and
            ``image`` (the file's name), ``greedy`` (``attention``'s caption), ``beam`` (the best of
            ``beam``), ``words [n, T]`` (padded with "") and ``attention [n, T, grid cells]``.
        """
        parts = data.arrays["parts"]
        splits = [name for name in TEST_SPLITS if name in parts]
        chosen = [(split, i) for split in splits for i in range(min(REPORT_IMAGES // len(splits), len(parts[split])))]
        image_bytes = np.array([image_data.read_image_bytes(parts[split].images[i], parts[split].source)
                                for split, i in chosen], dtype=object)
        attention = export("attention", {"image_bytes": image_bytes})
        beam = export("beam", {"image_bytes": image_bytes})
        return {"pixels": np.stack([data.arrays["pixels"][split][i] for split, i in chosen]),
                "split": np.array([split for split, _ in chosen]),
                "image": np.array([parts[split].images[i].name for split, i in chosen]),
                "greedy": unicode_texts(attention["caption"]), "beam": unicode_texts(beam["captions"][:, 0]),
                "words": unicode_texts(attention["words"]), "attention": attention["attention"].astype("float32")}

    def report_sections(self, result: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[Section]:
        """Test images with their captions and the sample captions, the attention of each word of one image
        per test split (from ``report_data``), and fact accuracy and BLEU-4 per split beside the baselines."""
        return [_captions_section(result, arrays), _attention_section(arrays), _accuracy_section(result)]

    def limits(self, config: CaptioningConfig, data: Splits) -> Limits:
        return Limits(max_batch_size=256, max_string_bytes=image_data.MAX_IMAGE_BYTES,
                      max_image_pixels=image_data.MAX_IMAGE_PIXELS, max_generated_length=config.max_caption_length)


def _attended_cells(files: list[str], captions: list[str], outputs: dict[str, np.ndarray]) -> tuple[str, Any]:
    """The ``attention`` signature's rows: per caption word, the feature-map cell it attends to most.

    Returns:
        ``(text, {"rows": [{"input", "caption", "alignment": [{"word", "cell", "region", "weight"}],
        "words", "attention"}]})``; ``cell`` is ``[row, column]`` from the top left, counted from 0,
        and the attention is cut to the caption's words.
    """
    lines, rows = [], []
    cells = outputs["attention"].shape[-1]
    for row, (name, caption) in enumerate(zip(files, captions)):
        words = [word for word in map(predictions.text, outputs["words"][row]) if word]
        alignment = [{"word": word, "cell": list(_grid_position(position, cells)),
                      "region": _grid_region(position, cells), "weight": round(weight, 4)}
                     for word, position, weight in predictions.strongest(words, outputs["attention"][row], cells)]
        lines.append(f"{name}: {predictions.said(caption, 'caption')}")
        if alignment:
            side = math.isqrt(cells)
            lines.append(f"  attention over the {side}x{side} grid (r1c1 top left): " + ", ".join(
                f"{a['word']}→{a['region']} r{a['cell'][0] + 1}c{a['cell'][1] + 1} {a['weight']:.2f}"
                for a in alignment))
        rows.append({"input": name, "caption": caption, "alignment": alignment, "words": words,
                     "attention": np.round(outputs["attention"][row][: len(words)].astype("float64"), 4).tolist()})
    return "\n".join(lines), {"rows": rows}


def _grid_position(position: int, cells: int) -> tuple[int, int]:
    """A cell of the square, row-major feature-map grid as ``(row, column)`` from the top left, from 0."""
    return divmod(position, max(math.isqrt(cells), 1))


def _grid_region(position: int, cells: int) -> str:
    """The part of the image a feature-map cell covers, in words ("top left", "centre", ...)."""
    side = max(math.isqrt(cells), 1)
    row, column = _grid_position(position, cells)
    vertical = ("top", "middle", "bottom")[3 * row // side]
    horizontal = ("left", "centre", "right")[3 * column // side]
    return "centre" if (vertical, horizontal) == ("middle", "centre") else f"{vertical} {horizontal}"


def _captions_section(result: dict[str, Any], arrays: dict[str, np.ndarray]) -> Section:
    """The report images with the export's greedy and beam captions, and the run's sample captions."""
    blocks: list[Any] = []
    if "pixels" in arrays:
        titles = [f"{predictions.said(greedy, 'caption')} | beam: {predictions.said(beam, 'caption')}"
                  for greedy, beam in zip(arrays["greedy"], arrays["beam"])]
        names = ", ".join(f"{split} {image}" for split, image in zip(arrays["split"], arrays["image"]))
        blocks.append(plots.image_grid("test_captions", list(arrays["pixels"]), titles, columns=3,
                                       caption=f"the greedy caption | beam search's best, as the export gives them "
                                               f"for {names}"))
    rows = [[split, sample["image"], *(predictions.said(sample[key], "caption") for key in ("greedy", "beam")),
             " / ".join(sample["references"])]
            for split in TEST_SPLITS for sample in result.get("metrics", {}).get(f"samples/{split}", [])]
    blocks.append(Table(["split", "image", "greedy", "beam", "references"], rows,
                        caption="the first images of each test split"))
    return Section("Test captions", blocks, anchor="captions")


def _attention_section(arrays: dict[str, np.ndarray]) -> Section:
    """For the first report image of each test split, one picture per caption word with its attention over it."""
    if "attention" not in arrays:
        return Section("Attention per word", [Text("No attention maps: this report was built without the run's "
                                                   "report data.")], anchor="attention")
    cells = arrays["attention"].shape[-1]
    side = math.isqrt(cells)
    blocks: list[Any] = []
    for row in np.unique(arrays["split"], return_index=True)[1]:
        words = [word for word in arrays["words"][row] if word][:ATTENTION_WORDS]
        if not words:
            continue
        maps = arrays["attention"][row, : len(words)].reshape(len(words), side, cells // max(side, 1))
        blocks.append(plots.image_grid(
            f"attention_{arrays['split'][row]}", [arrays["pixels"][row]] * len(words), list(words),
            overlays=list(maps), columns=4,
            caption=f"{arrays['split'][row]} {arrays['image'][row]}: where each word of the greedy caption "
                    f"attends (the {side}x{side} feature-map grid, brighter is more)"))
    return Section("Attention per word", blocks or [Text("The report images got empty captions.")],
                   anchor="attention")


def _accuracy_section(result: dict[str, Any]) -> Section:
    """Fact accuracy (generated scenes) and BLEU-4 on each test split, the model's searches beside the baselines."""
    metrics, baselines = result.get("metrics", {}), result.get("baseline") or {}
    systems = {"greedy search": (metrics, "greedy_"), "beam search": (metrics, "beam_"),
               "most frequent caption": (baselines.get("most_frequent", {}), ""),
               "nearest neighbour": (baselines.get("nearest_neighbour", {}), "")}
    blocks: list[Any] = []
    for key, label, scale in (("fact_accuracy", "captions with every fact right (%)", 100.0), ("bleu4", "BLEU-4", 1.0)):
        values = {name: {title: scale * found[f"{split}/{prefix}{key}"] for split, title in TEST_SPLITS.items()
                         if f"{split}/{prefix}{key}" in found} for name, (found, prefix) in systems.items()}
        values = {name: by_split for name, by_split in values.items() if by_split}
        if not values:
            continue
        splits = list(next(iter(values.values())))
        blocks += [Table(["", *splits], [[name, *(by_split.get(split) for split in splits)]
                                         for name, by_split in values.items()], caption=label),
                   plots.bar_chart(f"splits_{key}", label, values, label)]
    return Section("Fact accuracy and BLEU-4 per split", blocks or [Text("No test metrics.")], anchor="fact-accuracy")


def _scores(references: list[list[str]], hypotheses: list[str], truths: dict[str, scenes.Scene] | None,
            names: list[str], prefix: str) -> dict[str, Any]:
    """BLEU-1..4 against all references (and their signature), plus fact accuracy for generated scenes."""
    found: dict[str, Any] = {}
    for order in range(1, 5):
        bleu = seqapps_metrics.bleu(references, hypotheses, max_ngram_order=order)
        found[f"{prefix}bleu{order}"] = round(bleu["score"], 2)
    found[f"signature/{prefix}bleu4"] = bleu["signature"]
    if truths:
        correct = [scenes.check_caption(h, truths[n]) for h, n in zip(hypotheses, names)]
        found[f"{prefix}fact_accuracy"] = round(float(np.mean(correct)), 4)
    return found


class Captioner(tf.Module):
    """The trained model as in-graph captioning: image bytes in, captions out, with any decoding strategy.

    Args:
        model: the training model of ``ImageCaptioning.build_model``.
        state: the pipeline state (vocabulary, image size, decoding settings).
    """

    def __init__(self, model: keras.Model, state: dict[str, Any]) -> None:
        super().__init__(name="captioner")
        self.image_size = int(state["image_size"])
        self.max_length = int(state["max_caption_length"])
        lookup = text_data.Vocabulary(state["vocabulary"], [0] * len(state["vocabulary"])).lookup(name="vocabulary")
        initial = sorted((layer for layer in model.layers if layer.name.startswith("init_")),
                         key=lambda layer: layer.name)
        self.encoder = keras.Model(model.input["image"], [model.get_layer("memory").output,
                                                          model.get_layer("pooled").output,
                                                          *(layer.output for layer in initial)])
        self.generator = Generator(model.get_layer("decoder"), model.get_layer("output"), lookup, TOKENIZER,
                                   START_ID, END_ID)

    def preprocess(self, inputs: dict[str, tf.Tensor]) -> tf.Tensor:
        """The raw ``image_bytes [batch]`` of a request as float pixels ``[batch, size, size, 3]``."""
        return image_data.decode_images(tf.reshape(inputs["image_bytes"], [-1]), self.image_size, self.image_size)

    def generate(self, pixels: tf.Tensor, strategy: DecodingStrategy, attention: bool = False) -> Generation:
        """Captions a batch of pixels (0..255) with ``strategy``; ``attention`` collects the attention weights."""
        memory, _, *rnn_state = self.encoder(tf.cast(pixels, tf.float32), training=False)
        found = self.generator.generate({"rnn": list(rnn_state), "memory": memory}, strategy, self.max_length,
                                        attention)
        return Generation(found, self.generator.words(found.ids))

    def attention(self, pixels: tf.Tensor) -> dict[str, tf.Tensor]:
        """Pixels -> greedy ``caption``, its ``words [batch, T]`` and ``attention [batch, T, grid cells]``
        (rows of real words sum to 1; the grid is row-major)."""
        found = self.generate(pixels, GreedySearch(), attention=True)
        words = found.words[:, 0]
        weights = found.hypotheses.attention[:, 0] * tf.cast(words != "", tf.float32)[:, :, None]
        return {"caption": self.generator.texts(words), "words": words, "attention": weights}

    def features(self, pixels: np.ndarray, batch_size: int = 256) -> np.ndarray:
        """Pooled CNN features of uint8 images, for the nearest-neighbour baseline."""
        return np.concatenate([self.encoder(pixels[i: i + batch_size].astype("float32"), training=False)[1].numpy()
                               for i in range(0, len(pixels), batch_size)])

    def caption_pixels(self, pixels: np.ndarray, strategies: Sequence[DecodingStrategy],
                       functions: dict | None = None) -> list[list[str]]:
        """Captions of uint8 images with each strategy (its best hypothesis), for evaluation.

        ``functions``: the traced functions of earlier calls on this captioner (``generate_texts``).
        """
        return generate_texts(self.generator, self.generate, strategies, pixels, batch_size=128, functions=functions)
