"""What ``seqapps predict`` prints: the pieces several pipelines' ``format_prediction`` share.

A text row is headed by its input (``quoted`` for a text, the path as given for a file); an empty
output says what is empty (``said``); a beam's n-best list is numbered with its scores (``ranked``,
``ranked_rows``);
attention is shown, per output word, as the input position it attends to most (``strongest``).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def text(value: Any) -> str:
    """One string output (bytes decoded as UTF-8) or input as ``str``."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def quoted(value: Any) -> str:
    """A source text as a row's heading: quoted, so that an empty or blank text shows."""
    return repr(text(value))


def said(value: str, what: str) -> str:
    """An output text, or ``(empty WHAT)`` when it is empty or blank."""
    return value if value.strip() else f"(empty {what})"


def ranked(texts: Sequence[Any], scores: Sequence[float], what: str) -> tuple[list[str], list[dict[str, Any]]]:
    """A beam's n-best list, best first, as numbered lines and as JSON records.

    Args:
        texts: one row's hypotheses (``[beam]`` strings or bytes), best first.
        scores: their scores.
        what: what a hypothesis is ("translation"), for an empty one.

    Returns:
        ``(lines, [{"text": ..., "score": ...}])``; each line is ``"  1. text  (score -1.234)"``.
    """
    records = [{"text": text(value), "score": round(float(score), 4)} for value, score in zip(texts, scores)]
    lines = [f"  {rank}. {said(record['text'], what)}  (score {record['score']:.3f})"
             for rank, record in enumerate(records, start=1)]
    return lines, records


def ranked_rows(headings: Sequence[str], names: Sequence[str], texts: np.ndarray, scores: np.ndarray, what: str,
                key: str) -> tuple[str, Any]:
    """A beam signature's rows: each input's heading over its numbered n-best list (``ranked``).

    Args:
        headings: each row's input as printed (a quoted text, a file).
        names: each row's input as the JSON names it.
        texts, scores: ``[batch, beam]`` hypotheses, best first, and their scores.
        what: what a hypothesis is ("translation").
        key: the JSON key of a row's list ("translations").

    Returns:
        ``(text, {"rows": [{"input": name, key: [{"text", "score"}]}]})``.
    """
    lines, rows = [], []
    for heading, name, row_texts, row_scores in zip(headings, names, texts, scores):
        numbered, found = ranked(row_texts, row_scores, what)
        lines += [f"{heading}:", *numbered]
        rows.append({"input": name, key: found})
    return "\n".join(lines), {"rows": rows}


def strongest(words: Sequence[Any], weights: np.ndarray, positions: int) -> list[tuple[str, int, float]]:
    """Per output word, the input position it attends to most.

    Args:
        words: one row's output words, padded with ``""`` (padding is left out).
        weights: ``[words, input positions]`` attention weights of that row.
        positions: how many input positions are real (the rest is padding).

    Returns:
        ``[(word, position, weight)]`` for every real word, in order.
    """
    found = []
    for word, row in zip(map(text, words), np.asarray(weights)):
        if word and positions:
            best = int(np.argmax(row[:positions]))
            found.append((word, best, float(row[best])))
    return found
