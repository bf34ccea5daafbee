"""Time of the fused CTC beam search (``ctc.ctc_lm_beam_decode``) at two commits, in one process, interleaved.

A probe behind docs/results.md ("A pitch for the Festival voices, and a faster fused search"), not library code.
It loads ``seqapps/layers/ctc.py`` as it was at ``--before`` (``git show``) beside the working tree's, builds the
8-gram model of a generated corpus's training transcripts, and times both searches on the same batches:
an export's CTC log-probabilities of the corpus's first test clips (16 of them, and 64 of them each repeated 5
times, about 16 s of frames), and random logits at the batch sizes the serving limits admit. Each setting is
traced once, then timed in rounds that alternate between the two versions; the medians are printed, with
whether both versions return the same transcripts and scores.

Usage::

    python docs/probes/lm_search_cost.py EXPORT CORPUS --before 0e4b8a2 --beams 16,32 --rounds 3
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from seqapps import serializable
from seqapps.export_format import read_export
from seqapps.layers import ctc, ngram_lm

sys.path.insert(0, str(Path(__file__).parent))
from speech_lm_sweep import log_probs  # noqa: E402  (the sibling probe's reader of an export's log-probabilities)


def ctc_at(revision: str) -> object:
    """``seqapps.layers.ctc`` as it was at ``revision``, as a module of its own."""
    source = subprocess.run(["git", "show", f"{revision}:seqapps/layers/ctc.py"], capture_output=True, text=True,
                            check=True).stdout
    path = Path(tempfile.mkdtemp()) / "ctc_before.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("ctc_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def padded(clips: list[np.ndarray], classes: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Clips of log-probabilities as one batch, blank-only past each clip's end."""
    lengths = np.array([c.shape[0] for c in clips], np.int32)
    batch = np.full((len(clips), lengths.max(), classes), -30.0, np.float32)
    batch[:, :, 0] = 0.0
    for i, clip in enumerate(clips):
        batch[i, :clip.shape[0]] = clip
    return tf.constant(batch), tf.constant(lengths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export")
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--before", required=True, help="the commit whose search is the baseline")
    parser.add_argument("--beams", default="16")
    parser.add_argument("--fusion", default="0.5:1", help="weight:bonus")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    info = read_export(args.export)
    chars = info.state["chars"]
    with open(args.corpus / "metadata.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    lm = ngram_lm.CharNgramLM([row["transcript"] for row in rows if row["split"] == "train"], chars, 8)
    clips = log_probs(serializable.load_model(info.keras_model_path), args.corpus,
                      [row for row in rows if row["split"] == "test"][:64])
    random = np.random.default_rng(0)
    cases = {
        "test clips, 16": padded(clips[:16], len(chars)),
        "test clips, 64 x 5 repeats": padded([np.tile(c, (5, 1)) for c in clips], len(chars)),
        "random logits, 16 x 4 s": (tf.constant(3 * random.normal(size=(16, 133, len(chars))), tf.float32),
                                    tf.fill([16], 133)),
        "random logits, 64 x 15 s": (tf.constant(3 * random.normal(size=(64, 500, len(chars))), tf.float32),
                                     tf.fill([64], 500)),
    }
    weight, bonus = map(float, args.fusion.split(":"))
    space = chars.index(" ")
    versions = {"before": ctc_at(args.before), "after": ctc}
    for beams in (int(b) for b in args.beams.split(",")):
        searches = {name: tf.function(lambda x, n, m=module: m.ctc_lm_beam_decode(x, n, lm, beams, weight, bonus,
                                                                                   space))
                    for name, module in versions.items()}
        for case, (logits, lengths) in cases.items():
            found = {name: search(logits, lengths) for name, search in searches.items()}  # traced here
            same = (found["before"][0].to_list() == found["after"][0].to_list()
                    and np.allclose(found["before"][1], found["after"][1], atol=1e-4))
            seconds = {name: [] for name in searches}
            for _ in range(args.rounds):
                for name, search in searches.items():
                    start = time.perf_counter()
                    search(logits, lengths)
                    seconds[name].append(time.perf_counter() - start)
            before, after = (float(np.median(seconds[name])) for name in ("before", "after"))
            print(f"{beams} beams, {case} {tuple(logits.shape)}: before {before:.2f} s, after {after:.2f} s, "
                  f"{before / after:.2f}x; the same transcripts and scores: {same}", flush=True)


if __name__ == "__main__":
    main()
