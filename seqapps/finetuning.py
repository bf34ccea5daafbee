"""Growing (or reordering) a trained model's vocabularies for fine-tuning, as OpenNMT-tf's ``update_vocab`` does.

A pipeline that fine-tunes on data with new words, characters or tags builds a fresh model for the new
vocabularies (``Pipeline.build_model`` on the fine-tuning splits) and calls ``transfer_weights(exported,
fresh, index_maps)``. Every weight of the exported model is copied into the fresh one; a weight that is
indexed by a vocabulary (its layer is named in ``index_maps``) is copied entry by entry to each entry's
new position (``VocabularyMap``). An added entry keeps the value the fresh model was built with: the layer's
initializer (embedding rows, Dense output columns, zero Dense biases), or what the pipeline's
``build_model`` set (the B-NCE output bias starts at the log-unigram of the fine-tuning data), which is
where a model trained from scratch would start that word. So, before any training, the old entries'
outputs (logits, tag scores) are those of the exported model.

Which axis of which weight a vocabulary indexes is known per layer class (``vocabulary_axis``):

- ``keras.layers.Embedding``: the rows of ``embeddings``;
- ``keras.layers.Dense`` (an output layer): the columns (units) of ``kernel`` and the entries of ``bias``;
- ``BatchNCE``: the rows of ``kernel`` and ``bias``; its noise distribution (``noise_probs``,
  ``noise_cdf``) is NOT copied: B-NCE's noise samples are the batch's targets, so its noise distribution
  must be the unigram of the data being trained on, which the fresh layer holds;
- ``LexiconBias``: the rows of ``table_ids`` and ``table_probs`` (source words). Its ``table_ids`` hold
  target word ids: pass the target vocabulary's map as ``value_maps={"lexicon/table_ids": ...}`` and the
  old ids are renumbered (an id that left the vocabulary becomes ``<unk>``, 0). Added source words keep
  the fresh layer's rows, the lexicon the pipeline fitted on the fine-tuning data;
- a recurrent cell (``RECURRENT_CELLS``) that reads one-hot ids: the first rows of ``kernel``; rows after the
  vocabulary's (the hierarchical RNN's bottom cell reads the state of the level above after its characters)
  are copied as they are.

Optimizer slots are not transferred: ``finetune`` compiles a fresh optimizer.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Iterable, Mapping, Sequence

import keras
import numpy as np

from seqapps.data import text as text_data
from seqapps.errors import ConfigError
from seqapps.layers.batch_nce import BatchNCE
from seqapps.layers.lexicon import LexiconBias

#: the ``vocabulary`` config choices of the pipelines that fine-tune on text: "extend" adds the fine-tuning
#: data's new words (``grow_vocabulary``); "keep" keeps the export's, new words becoming ``<unk>``.
VOCABULARY_CHOICES = ("extend", "keep")
#: ``vocabulary_axis`` of a weight that the fresh model's own value replaces (never copied).
FRESH = "fresh"
#: cells whose ``kernel`` rows a one-hot vocabulary indexes when the model feeds them one-hot ids
RECURRENT_CELLS = (keras.layers.SimpleRNNCell, keras.layers.GRUCell, keras.layers.LSTMCell)


@dataclasses.dataclass(frozen=True)
class VocabularyMap:
    """Where each entry of a new vocabulary comes from in the old one.

    Attributes:
        old_ids: int ``[new size]``: the old id of each new id, -1 for an entry the old vocabulary lacks.
        old_size: the old vocabulary's size.
    """

    old_ids: np.ndarray
    old_size: int

    def __post_init__(self) -> None:
        old_ids = np.asarray(self.old_ids, "int64")
        kept = old_ids[old_ids >= 0]
        if old_ids.ndim != 1 or kept.size and (kept.max() >= self.old_size or len(np.unique(kept)) < kept.size):
            raise ValueError(f"`old_ids` must be distinct ids in [0, {self.old_size}) or -1; got {old_ids.tolist()}")
        object.__setattr__(self, "old_ids", old_ids)

    @classmethod
    def from_tokens(cls, old: Sequence[str], new: Sequence[str]) -> "VocabularyMap":
        """The map between two token lists: a token keeps its values wherever it moves.

        Args:
            old: the exported model's tokens, by id.
            new: the fine-tuning model's tokens, by id.
        """
        index = {token: i for i, token in enumerate(old)}
        return cls(np.array([index.get(token, -1) for token in new], "int64"), len(old))

    @property
    def new_size(self) -> int:
        """The new vocabulary's size."""
        return len(self.old_ids)

    @property
    def added(self) -> np.ndarray:
        """The new ids of the entries the old vocabulary lacks."""
        return np.flatnonzero(self.old_ids < 0)

    @property
    def is_identity(self) -> bool:
        """True when the vocabulary is unchanged."""
        return self.new_size == self.old_size and bool(np.all(self.old_ids == np.arange(self.old_size)))

    def place(self, old: np.ndarray, fresh: np.ndarray, axis: int, trailing: int = 0) -> np.ndarray:
        """``fresh`` with the old entries along ``axis`` copied to their new positions.

        Args:
            old: the exported values, ``old_size + trailing`` long on ``axis``.
            fresh: the fresh model's values, ``new_size + trailing`` long on ``axis``; the other axes as ``old``'s.
            axis: the vocabulary axis.
            trailing: entries after the vocabulary's on ``axis``, copied from ``old`` as they are (a recurrent
                cell's kernel reads the one-hot vocabulary, then the state of the level above).

        Returns:
            A new array: entry ``i < new_size`` along ``axis`` is ``old``'s entry ``old_ids[i]``, or ``fresh``'s
            when -1; the trailing entries are ``old``'s.
        """
        old_moved, out = np.moveaxis(np.asarray(old), axis, 0), np.moveaxis(np.array(fresh, copy=True), axis, 0)
        if (old_moved.shape[0] != self.old_size + trailing or out.shape[0] != self.new_size + trailing
                or old_moved.shape[1:] != out.shape[1:]):
            raise ValueError(f"a vocabulary axis maps {self.old_size} entries to {self.new_size} (and {trailing} "
                             f"more after them); got shapes {np.shape(old)} and {np.shape(fresh)} (axis {axis})")
        kept = np.flatnonzero(self.old_ids >= 0)
        out[kept] = old_moved[self.old_ids[kept]]
        out[self.new_size:] = old_moved[self.old_size:]
        return np.moveaxis(out, 0, axis)

    def renumber(self, old_ids: np.ndarray, missing: int = 0) -> np.ndarray:
        """Old ids as new ids (an old id without a new one becomes ``missing``), for weights that hold ids."""
        new_of_old = np.full(self.old_size, missing, "int64")
        kept = np.flatnonzero(self.old_ids >= 0)
        new_of_old[self.old_ids[kept]] = kept
        return new_of_old[np.asarray(old_ids)].astype(np.asarray(old_ids).dtype)


def grow_vocabulary(old: Sequence[str], words: Iterable[str], min_count: int = 1,
                    max_size: int | None = None) -> list[str]:
    """The exported tokens, then the fine-tuning words they lack, as OpenNMT-tf's ``update_vocab`` "merge".

    The old tokens keep their ids, so the old model's rows stay where they are.

    Args:
        old: the export's tokens, by id.
        words: the fine-tuning training tokens.
        min_count: a new word is added when seen at least this often.
        max_size: the most tokens of the result (None: no limit); the most frequent new words are added first.

    Returns:
        ``old`` followed by the new words, most frequent first (ties: first seen).
    """
    known = set(old)
    counts = collections.Counter(word for word in words if word not in known)
    added = [word for word, count in counts.most_common() if count >= min_count]
    room = len(added) if max_size is None else max(0, max_size - len(old))
    return [*old, *added[:room]]


def vocabulary_report(old_size: int, tokens: Sequence[str], test_words: Iterable[str]) -> dict[str, Any]:
    """One entry of the ``seqapps.pipeline.VOCABULARIES`` report.

    Args:
        old_size: how many of ``tokens`` the export had (``len(tokens)`` for a model trained from scratch).
        tokens: the model's vocabulary, exported tokens first.
        test_words: the test split's words.

    Returns:
        ``{"added": [...], "size": N, "oov_rate": share of test words outside the vocabulary}`` (None
        without test words).
    """
    known = set(tokens)
    outside = [word not in known for word in test_words]
    return {"added": list(tokens[old_size:]), "size": len(tokens),
            "oov_rate": round(float(np.mean(outside)), 4) if outside else None}


def vocabulary_axis(layer: keras.layers.Layer, weight_name: str) -> int | str | None:
    """The axis of one of ``layer``'s own weights that its vocabulary indexes.

    Returns:
        The axis; ``FRESH`` for a vocabulary-sized weight that is not copied (B-NCE's noise distribution);
        None for a weight no vocabulary indexes (a recurrent kernel inside a mapped decoder).
    """
    if isinstance(layer, BatchNCE):
        return {"kernel": 0, "bias": 0, "noise_probs": FRESH, "noise_cdf": FRESH}.get(weight_name)
    if isinstance(layer, LexiconBias):
        return {"table_ids": 0, "table_probs": 0}.get(weight_name)
    if isinstance(layer, keras.layers.Embedding):
        return {"embeddings": 0}.get(weight_name)
    if isinstance(layer, keras.layers.Dense):
        return {"kernel": -1, "bias": 0}.get(weight_name)
    if isinstance(layer, RECURRENT_CELLS):
        return {"kernel": 0}.get(weight_name)
    return None


def _layers_by_path(model: keras.Model) -> dict[str, keras.layers.Layer]:
    """Every layer of ``model``, nested ones included, by its Keras path (``decoder/embedding``)."""
    found = {}
    for top in model.layers:
        # Keras 3 lists a layer's nested layers (AttentionDecoder's embedding) only through this private method
        for layer in top._flatten_layers(include_self=True, recursive=True):
            if layer.path:
                found.setdefault(layer.path, layer)
    return found


def transfer_weights(source: keras.Model, target: keras.Model, index_maps: Mapping[str, VocabularyMap],
                     value_maps: Mapping[str, VocabularyMap] | None = None) -> None:
    """Copies a trained model's weights into a model of the same architecture built for new vocabularies.

    The two models' weights are paired in order (``model.weights``: the same architecture lists them in
    the same order, whatever the automatic layer names). A weight of a layer named in ``index_maps`` is
    placed entry by entry on its vocabulary axis (``vocabulary_axis``); every other weight must have the
    same shape in both models and is copied whole.

    Args:
        source: the exported (trained) model.
        target: the fresh model for the new vocabularies, as ``build_model`` returns it; changed in place.
        index_maps: layer path in ``target`` (``"output"``, ``"decoder/embedding"``: a nested layer is named
            by its path) -> the map of the vocabulary that indexes that layer's own weights.
        value_maps: weight path in ``target`` (``"lexicon/table_ids"``) -> the map of the ids the weight
            holds: the exported entries' ids are renumbered (the fresh entries hold new ids already).

    Raises:
        ConfigError: the models' weights do not pair up, or a weight's shape changed where no vocabulary
            explains it (the config builds another architecture than the export's).
        ValueError: a key names no layer of ``target``, or a layer no vocabulary indexes.
    """
    value_maps = dict(value_maps or {})
    layers = _layers_by_path(target)
    unknown = [key for key in [*index_maps, *(path.rpartition("/")[0] for path in value_maps)] if key not in layers]
    if unknown:
        raise ValueError(f"no layer {unknown[0]!r} in the model; its layers: {', '.join(sorted(layers))}")
    unindexed = [key for key in index_maps if all(vocabulary_axis(layers[key], weight.name) is None
                                                  for weight in layers[key].weights)]
    if unindexed:
        raise ValueError(f"layer {unindexed[0]!r} ({type(layers[unindexed[0]]).__name__}) has no weight a "
                         "vocabulary indexes (see seqapps.finetuning.vocabulary_axis)")
    if len(source.weights) != len(target.weights):
        raise ConfigError(f"the exported model has {len(source.weights)} weights, the new one {len(target.weights)}: "
                          "fine-tune with the exported architecture")
    for old, fresh in zip(source.weights, target.weights):
        old_value, fresh_value = keras.ops.convert_to_numpy(old), keras.ops.convert_to_numpy(fresh)
        if old.name != fresh.name:
            raise ConfigError(f"weight {old.path!r} of the exported model pairs with {fresh.path!r}: "
                              "fine-tune with the exported architecture")
        if fresh.path in value_maps:  # the old ids it holds, as new ids (the fresh entries are new ids already)
            old_value = value_maps[fresh.path].renumber(old_value)
        mapping = index_maps.get(fresh.path.rpartition("/")[0])
        axis = None if mapping is None else vocabulary_axis(layers[fresh.path.rpartition("/")[0]], fresh.name)
        if axis == FRESH:
            continue
        if axis is None and old_value.shape != fresh_value.shape:
            raise ConfigError(f"weight {fresh.path!r} has shape {fresh_value.shape}, {old_value.shape} in the "
                              "exported model, and no vocabulary map explains it: fine-tune with the exported "
                              "architecture")
        if axis is None:
            value = old_value
        else:  # a cell's kernel reads other inputs after the one-hot vocabulary
            cell = isinstance(layers[fresh.path.rpartition("/")[0]], RECURRENT_CELLS)
            value = mapping.place(old_value, fresh_value, axis, old_value.shape[axis] - mapping.old_size if cell else 0)
        fresh.assign(value.astype(fresh_value.dtype))


def fine_tuning_vocabulary(exported: Mapping[str, list], training_tokens: Sequence[str], policy: str = "extend",
                           max_size: int | None = None, min_count: int = 1) -> text_data.Vocabulary:
    """The vocabulary of a text model (``seqapps.data.text.Vocabulary``) fine-tuned on ``training_tokens``.

    With "extend", the vocabulary the fine-tuning data would get from scratch (``build_vocabulary`` with
    ``max_size`` and ``min_count``) is merged into the export's, as OpenNMT-tf's ``update_vocab`` merges a
    new vocabulary file: the exported tokens keep their ids and the data's tokens they lack follow, the most
    frequent first. So ``max_size`` bounds what one data set brings, not the merged size.

    Args:
        exported: the export's ``Vocabulary.state()``.
        training_tokens: the fine-tuning training split's tokens.
        policy: one of ``VOCABULARY_CHOICES``; "keep": the export's tokens.
        max_size, min_count: the config's rules for a vocabulary built from scratch.

    Returns:
        The vocabulary, counted on ``training_tokens``.
    """
    tokens = exported["tokens"]
    if policy == "extend":  # the data's own tokens, each once, in decreasing count: grow_vocabulary keeps that order
        tokens = grow_vocabulary(tokens, text_data.build_vocabulary(training_tokens, max_size, min_count).tokens)
    return text_data.Vocabulary.counted(tokens, collections.Counter(training_tokens))
