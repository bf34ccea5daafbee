"""What a person reads at the end of ``seqapps run`` and ``seqapps finetune``.

The summary puts the pipeline's declared headline metrics (``Pipeline.headline_metrics``) in a
table beside every baseline, in units; then the model's other numbers grouped by split or kind,
nested results on lines of their own (results per test set, voice or tag as a table), the split counts, what
fine-tuning added to the vocabularies, and the export's path. It reads only the run's result
dict, so it needs neither TensorFlow nor the trained model.
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Iterable, Sequence

from seqapps.pipeline import SPLIT_COUNTS, VOCABULARIES, Headline

LINE_WIDTH = 100
#: the widest a table of results per name may be before each name takes a line of its own
TABLE_WIDTH = 120
#: words of a vocabulary's additions named before "..."
NAMED_ADDITIONS = 8


def number(value: Any) -> str:
    """A number as the summary prints it: an integer whole, a float to 4 significant digits; ``n/a`` for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "n/a"
    return str(value) if isinstance(value, int) else f"{value:.4g}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def headlines_of(result: dict[str, Any], declared: Sequence[Headline]) -> tuple[Headline, ...]:
    """The declared headline metrics that the result holds; without any, every top-level number of the model.

    Args:
        result: the run result (``seqapps.runner.run``).
        declared: the pipeline's ``headline_metrics``.
    """
    metrics = result["metrics"]
    found = tuple(h for h in declared if h.key in metrics)
    return found or tuple(Headline(key) for key, value in metrics.items() if _is_number(value) and "/" not in key)


def _table(rows: dict[str, dict[str, Any]], baselines: set[str], headlines: Sequence[Headline]) -> list[str]:
    """A table of the headline values: a row per model or baseline, a column per headline."""
    width = max(len(name) for name in rows)
    columns = [max(10, len(h.title()) + 2) for h in headlines]
    lines = [" " * width + "".join(f"{h.title():>{c}}" for h, c in zip(headlines, columns))]
    for name, values in rows.items():
        cells = (number(h.value(values, baseline=name in baselines)) for h in headlines)
        lines.append(f"{name:<{width}}" + "".join(f"{cell:>{c}}" for cell, c in zip(cells, columns)))
    return lines


def _wrapped(label: str, items: Iterable[str]) -> list[str]:
    """``label: a, b, c`` wrapped at ``LINE_WIDTH``, continuation lines indented."""
    text = f"{label}: " + ", ".join(items)
    return textwrap.wrap(text, LINE_WIDTH, subsequent_indent="    ", break_long_words=False, break_on_hyphens=False)


def flat_numbers(value: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """The numbers of a nested dict as ``(dotted key, value)`` pairs."""
    pairs = []
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, dict):
            pairs += flat_numbers(item, f"{name}.")
        elif _is_number(item):
            pairs.append((name, item))
    return pairs


def _is_records(value: Any) -> bool:
    """True for ``{name: {field: number}}``: results per test set, per voice or per tag, one row each."""
    return bool(value) and all(isinstance(record, dict) and record and all(map(_is_number, record.values()))
                               for record in value.values())


def _records_table(label: str, records: dict[str, dict[str, Any]]) -> list[str]:
    """A table of ``records``: a row per name, a column per field. Where the names are too long to share a line
    with the numbers within ``TABLE_WIDTH``, each name takes a line of its own above its numbers."""
    fields = list(dict.fromkeys(field for record in records.values() for field in record))
    columns = [max(8, len(field)) + 2 for field in fields]
    names = {name: f"  {name}" for name in records}
    width = max(len(label) + 1, *(len(name) for name in names.values()))

    def cells(record: dict[str, Any]) -> str:
        return "".join(f"{number(record.get(field)):>{column}}" for field, column in zip(fields, columns))

    header = "".join(f"{field:>{column}}" for field, column in zip(fields, columns))
    if width + sum(columns) <= TABLE_WIDTH:
        return [f"{label + ':':<{width}}{header}"] + [f"{names[name]:<{width}}{cells(record)}"
                                                      for name, record in records.items()]
    lines = [f"{label}:", f"    {header}"]
    for name, record in records.items():
        lines += [names[name], f"    {cells(record)}"]
    return lines


def _other_metrics(metrics: dict[str, Any], headlines: Sequence[Headline]) -> list[str]:
    """The model's numbers that are not headlines: grouped by their ``split/`` prefix; nested ones on their own
    lines, and results per name (``_is_records``) as a table."""
    shown = {h.key for h in headlines}
    groups: dict[str, list[str]] = {}
    lines: list[str] = []
    for key, value in metrics.items():
        if key in shown:
            continue
        if isinstance(value, dict):
            if _is_records(value):
                lines += _records_table(key, value)
            elif pairs := flat_numbers(value):
                lines += _wrapped(key, (f"{name} {number(item)}" for name, item in pairs))
        elif _is_number(value):
            group, _, name = key.rpartition("/")
            groups.setdefault(group, []).append(f"{name} {number(value)}")
    ordered = [_wrapped(f"{group} metrics" if group else "other metrics", items) for group, items in groups.items()]
    return [line for block in ordered for line in block] + lines


def _split_counts(report: dict[str, Any]) -> list[str]:
    counts = report.get(SPLIT_COUNTS)
    if not counts:
        return []
    unit = counts.get("unit", "items")
    return [f"split: {counts['train']} train / {counts['val']} validation / {counts['test']} test {unit}"]


def _vocabularies(report: dict[str, Any], finetuned: bool) -> list[str]:
    """A line per vocabulary: its size, and at fine-tuning what was added or removed and the unknown share left."""
    lines = []
    for kind, facts in (report.get(VOCABULARIES) or {}).items():
        parts = [f"{facts['size']} in all"] if facts.get("size") is not None else []
        for change in ("added", "removed"):
            items = facts.get(change)
            if items or (finetuned and change == "added" and items is not None):
                named = ", ".join(map(str, items[:NAMED_ADDITIONS])) + (", ..." if len(items) > NAMED_ADDITIONS else "")
                parts.append(f"{len(items)} {change}" + (f" ({named})" if items else ""))
        if facts.get("oov_rate") is not None:
            parts.append(f"{100 * facts['oov_rate']:.3g}% of test {kind} unknown")
        lines.append(f"{kind}: " + "; ".join(parts))
    return lines


def _backtest(backtest: dict[str, Any], headlines: Sequence[Headline]) -> list[str]:
    spread = {"model": backtest["metrics"], **backtest["baseline"]}
    width = max(len(name) for name in spread)
    columns = [max(20, len(h.title()) + 2) for h in headlines]
    lines = [f"backtest over {backtest['folds']} folds (mean +- standard deviation):",
             " " * width + "".join(f"{h.title():>{c}}" for h, c in zip(headlines, columns))]
    for name, values in spread.items():
        cells = []
        for headline, column in zip(headlines, columns):
            found = values.get(headline.key if name == "model" else (headline.baseline_key or headline.key)) or {}
            if found.get("mean") is None:
                cells.append(f"{'n/a':>{column}}")
            else:
                mean, std = headline.scale * found["mean"], headline.scale * found["std"]
                cells.append(f"{number(mean):>{column - 10}} +- {std:<6.3g}")
        lines.append(f"{name:<{width}}" + "".join(cells))
    lines += [f"fold {index + 1}: {note}" for index, note in enumerate(backtest.get("notes", [])) if note]
    return lines


def headline_rows(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The rows of the headline table: the model before fine-tuning (if it was), the model, each baseline."""
    rows = {"model": result["metrics"], **result.get("baseline", {})}
    return {"before finetune": result["metrics_before"], **rows} if "metrics_before" in result else rows


def run_summary(result: dict[str, Any], declared: Sequence[Headline] = ()) -> str:
    """The terminal summary of a run or fine-tuning.

    Args:
        result: what ``seqapps.runner.run`` or ``finetune`` returned.
        declared: the pipeline's ``headline_metrics``.

    Returns:
        The lines to print, the last two ``report: PATH`` (where it was built) and ``export: PATH``.
    """
    headlines = headlines_of(result, declared)
    rows = headline_rows(result)
    finetuned = "finetuned_from" in result
    verb = f"fine-tuned from {result['finetuned_from']}" if finetuned else f"{result['preset']} preset"
    lines = [f"{result['pipeline']} ({verb}) in {result['seconds']} s"]
    if headlines:
        lines += _table(rows, set(result.get("baseline", {})), headlines)
    lines += _other_metrics(result["metrics"], headlines)
    if (result.get("training") or {}).get("note"):
        lines.append(f"training: {result['training']['note']}")
    if "backtest" in result and headlines:
        lines += _backtest(result["backtest"], headlines)
    data = result.get("data", {})
    read = [f"separator {data['csv']['separator']!r}, decimal {data['csv']['decimal']!r}"] if "csv" in data else []
    read += [f"time zone {data['timezone']}"] if data.get("timezone") else []
    if data.get("source"):
        lines.append(f"data: {data['source']}" + (f" ({'; '.join(read)})" if read else ""))
    lines += _split_counts(data) + _vocabularies(data, finetuned)
    if result.get("report"):
        logs = Path(result["run_folder"]).parent.parent
        lines.append(f"report: {result['report']} (TensorBoard: tensorboard --logdir {logs})")
    lines.append(f"export: {result['export']}")
    return "\n".join(lines)
