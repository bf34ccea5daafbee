"""Beam CER of a trained speech model with a character n-gram model in the search, by order, weight and bonus.

A probe behind docs/results.md ("A character language model in the beam search"), not library code. It reads an
export's Keras model and a generated corpus folder (``metadata.csv`` with ``split``, ``engine`` and ``transcript``
columns, as ``seqapps.data.speech`` writes it), computes the CTC log-probabilities of the validation and test clips
once, builds ``seqapps.layers.ngram_lm.CharNgramLM`` of each order from the training transcripts, and decodes with
``ctc.ctc_lm_beam_decode`` (the search the export's ``beam`` signature runs) at each ``weight:bonus``. Weight 0 and
bonus 0 is the prefix search without the language model. One JSON line per setting: the validation CER (where
a setting is chosen) and the test CER and WER per engine.

Usage::

    python docs/probes/speech_lm_sweep.py EXPORT CORPUS --orders 4,6,8 --fusions 0:0,0.5:1,0.8:2 --beams 8,16
"""
from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import keras
import numpy as np
import soundfile
import tensorflow as tf

from seqapps import serializable
from seqapps.export_format import read_export
from seqapps.layers import ctc, ngram_lm
from seqapps.metrics import character_error_rate, word_error_rate

BATCH = 16


def log_probs(model: keras.Model, corpus: Path, rows: list[dict[str, str]]) -> list[np.ndarray]:
    """Each clip's CTC log-probabilities [frames, classes]."""
    found = []
    for start in range(0, len(rows), BATCH):
        waves = [soundfile.read(corpus / row["path"], dtype="float32")[0] for row in rows[start:start + BATCH]]
        lengths = np.array([w.size for w in waves], np.int32)
        batch = np.zeros((len(waves), lengths.max()), np.float32)
        for i, wave in enumerate(waves):
            batch[i, :wave.size] = wave
        logits = model({"waveform": tf.constant(batch), "length": tf.constant(lengths)}, training=False)
        frames = model.output_lengths(tf.constant(lengths)).numpy()
        found += [row[:n] for row, n in zip(tf.nn.log_softmax(logits).numpy(), frames)]
    return found


def decode(clips: list[np.ndarray], lm: ngram_lm.CharNgramLM, chars: list[str], beams: int, weight: float,
           bonus: float) -> list[str]:
    """The transcripts of the beam search with the language model."""
    table, space = tf.constant(chars), chars.index(" ")
    search = tf.function(lambda x, n: ctc.ids_to_text(
        ctc.ctc_lm_beam_decode(x, n, lm, beams, weight, bonus, space)[0], table), reduce_retracing=True)
    texts = []
    for start in range(0, len(clips), BATCH):
        chunk = clips[start:start + BATCH]
        lengths = np.array([c.shape[0] for c in chunk], np.int32)
        padded = np.full((len(chunk), lengths.max(), len(chars)), -30.0, np.float32)  # past the end: unread
        for i, clip in enumerate(chunk):
            padded[i, :clip.shape[0]] = clip
        texts += [t.decode("utf-8") for t in search(tf.constant(padded), tf.constant(lengths)).numpy()]
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export")
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--orders", default="8")
    parser.add_argument("--fusions", default="0:0,0.8:2")
    parser.add_argument("--beams", default="16")
    parser.add_argument("--lm-text", choices=("transcripts", "pool"), default="transcripts",
                        help="count the training transcripts, or every training-side sentence of the corpus's "
                             "sentences.json (the pool the training sentences are drawn from)")
    args = parser.parse_args()
    info = read_export(args.export)
    model = serializable.load_model(info.keras_model_path)
    chars = info.state["chars"]
    with open(args.corpus / "metadata.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    train = [row["transcript"] for row in rows if row["split"] == "train"]
    if args.lm_text == "pool":
        train = json.loads((args.corpus / "sentences.json").read_text())["sentences"]["train"]
    held = {split: [row for row in rows if row["split"] == split] for split in ("val", "test")}
    clips = {split: log_probs(model, args.corpus, part) for split, part in held.items()}
    for order in (int(o) for o in args.orders.split(",")):
        lm = ngram_lm.CharNgramLM(train, chars, order)
        for beams in (int(b) for b in args.beams.split(",")):
            for weight, bonus in (map(float, f.split(":")) for f in args.fusions.split(",")):
                line = {"lm_text": args.lm_text, "order": order, "beams": beams, "weight": weight, "bonus": bonus}
                for split, part in held.items():
                    texts = decode(clips[split], lm, chars, beams, weight, bonus)
                    truth = [row["transcript"] for row in part]
                    line[f"{split}_cer"] = round(100 * character_error_rate(truth, texts), 2)
                    if split == "test":
                        for engine in dict.fromkeys(row["engine"] for row in part):
                            chosen = [i for i, row in enumerate(part) if row["engine"] == engine]
                            pick = ([truth[i] for i in chosen], [texts[i] for i in chosen])
                            line[f"{engine}_cer"] = round(100 * character_error_rate(*pick), 2)
                            line[f"{engine}_wer"] = round(100 * word_error_rate(*pick), 1)
                print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
