"""CSV tables and regular time series, validated with errors that name file, line and column."""
from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np
import pandas as pd

from seqapps.errors import DataError

FILL_METHODS = ("none", "interpolate", "ffill")
_SNIFF_BYTES = 8192


def read_csv(path: str | Path) -> pd.DataFrame:
    """Reads a UTF-8 CSV file with a header row, keeping every cell as text.

    Args:
        path: the file to read.

    Returns:
        A DataFrame of strings (empty cells are NaN), one row per data line.

    Raises:
        DataError: the file is missing, binary, not UTF-8, empty, or has no data rows.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    raw = path.read_bytes()
    if b"\x00" in raw[:_SNIFF_BYTES]:
        raise DataError(f"{path}: looks like a binary file, expected a CSV text file with a header row")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: byte {error.start} is not UTF-8 text; save the CSV as UTF-8") from None
    if not text.strip():
        raise DataError(f"{path}: the file is empty, expected a header row and data rows")
    try:
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False,
                            na_values=["", "NaN", "nan", "NA", "N/A", "null"])
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise DataError(f"{path}: not a readable CSV ({str(error).splitlines()[0]})") from None
    if frame.empty:
        raise DataError(f"{path}: has a header but no data rows")
    frame.attrs["source"] = str(path)
    frame.attrs["first_line"] = 2  # line 1 is the header
    return frame


@dataclasses.dataclass
class TimeSeries:
    """A regular time series.

    Attributes:
        frame: float64 columns indexed by a regular, increasing DatetimeIndex.
        step: the sampling interval.
        filled: how many values were filled (gaps and empty cells), when asked to.
    """

    frame: pd.DataFrame
    step: pd.Timedelta
    filled: int = 0


def _where(frame: pd.DataFrame, position: int) -> str:
    """Names a data row as ``file line N`` (CSV) or ``source row N`` (embedded data)."""
    source = frame.attrs.get("source", "data")
    if "first_line" in frame.attrs:
        return f"{source} line {position + frame.attrs['first_line']}"
    return f"{source} row {position + 1}"


def to_time_series(
    frame: pd.DataFrame,
    timestamp_col: str,
    value_cols: list[str],
    fill_gaps: str = "none",
) -> TimeSeries:
    """Validates a table as a regular time series.

    Args:
        frame: a table from ``read_csv`` or an embedded source (``attrs["source"]`` names it).
        timestamp_col: the column of timestamps (any format pandas parses).
        value_cols: numeric columns to keep, in this order.
        fill_gaps: "none" (gaps and empty cells are errors), "interpolate" (linear in
            time) or "ffill" (carry the last value forward).

    Returns:
        The validated series.

    Raises:
        DataError: a missing column, an unparseable, duplicate or out-of-order
            timestamp, a gap, a non-numeric or empty cell.
    """
    source = frame.attrs.get("source", "data")
    if fill_gaps not in FILL_METHODS:
        raise DataError(f"fill_gaps={fill_gaps!r}: expected one of {', '.join(FILL_METHODS)}")
    for column in [timestamp_col, *value_cols]:
        if column not in frame.columns:
            raise DataError(f"{source}: missing column {column!r} (columns are: {', '.join(map(str, frame.columns))})")

    times = _parse_timestamps(frame, timestamp_col)
    values = pd.DataFrame({column: _parse_numbers(frame, column, allow_empty=fill_gaps != "none")
                           for column in value_cols})
    values.index = pd.DatetimeIndex(times, name=timestamp_col)
    step = _check_order_and_step(frame, times, allow_gaps=fill_gaps != "none")

    if fill_gaps == "none":
        return TimeSeries(values, step, 0)
    full_index = pd.date_range(values.index[0], values.index[-1], freq=step, name=timestamp_col)
    values = values.reindex(full_index)
    filled = int(values.isna().to_numpy().sum())
    if fill_gaps == "interpolate":
        values = values.interpolate(method="time", limit_direction="both")
    else:
        values = values.ffill().bfill()
    return TimeSeries(values, step, filled)


def _parse_timestamps(frame: pd.DataFrame, column: str) -> np.ndarray:
    text = frame[column]
    empty = text.isna()
    if empty.any():
        position = int(np.flatnonzero(empty.to_numpy())[0])
        raise DataError(f"{_where(frame, position)}: column {column!r} is empty, expected a date/time")
    parsed = pd.to_datetime(text, errors="coerce", format="mixed")
    bad = parsed.isna()
    if bad.any():
        position = int(np.flatnonzero(bad.to_numpy())[0])
        raise DataError(f"{_where(frame, position)}: column {column!r} value {text.iloc[position]!r} "
                        "is not a date/time (expected e.g. 2024-01-31 13:00)")
    if getattr(parsed.dt, "tz", None) is not None:
        parsed = parsed.dt.tz_localize(None)  # keep the local wall-clock time
    return parsed.to_numpy()


def _parse_numbers(frame: pd.DataFrame, column: str, allow_empty: bool) -> np.ndarray:
    text = frame[column]
    numbers = pd.to_numeric(text, errors="coerce").astype("float64")
    not_numeric = numbers.isna() & text.notna()
    if not_numeric.any():
        position = int(np.flatnonzero(not_numeric.to_numpy())[0])
        raise DataError(f"{_where(frame, position)}: column {column!r} value {text.iloc[position]!r} is not a number")
    infinite = np.isinf(numbers.to_numpy())
    if infinite.any():
        position = int(np.flatnonzero(infinite)[0])
        raise DataError(f"{_where(frame, position)}: column {column!r} value is infinite, expected a finite number")
    if not allow_empty and numbers.isna().any():
        position = int(np.flatnonzero(numbers.isna().to_numpy())[0])
        raise DataError(f"{_where(frame, position)}: column {column!r} is empty or NaN, expected a number "
                        "(or pass --set fill_gaps=interpolate to fill it)")
    return numbers.to_numpy()


def _check_order_and_step(frame: pd.DataFrame, times: np.ndarray, allow_gaps: bool) -> pd.Timedelta:
    if len(times) < 2:
        raise DataError(f"{frame.attrs.get('source', 'data')}: has {len(times)} row, expected a series of many rows")
    deltas = np.diff(times)
    zero = np.timedelta64(0, "ns")
    for problem, message in ((deltas == zero, "duplicate timestamp {t} (same as the row before)"),
                             (deltas < zero, "timestamp {t} is earlier than the row before; rows must be in time order")):
        if problem.any():
            position = int(np.flatnonzero(problem)[0]) + 1
            raise DataError(f"{_where(frame, position)}: " + message.format(t=pd.Timestamp(times[position])))
    values, counts = np.unique(deltas, return_counts=True)
    step = values[np.argmax(counts)]
    off_grid = (deltas % step) != zero
    if off_grid.any():
        position = int(np.flatnonzero(off_grid)[0]) + 1
        raise DataError(f"{_where(frame, position)}: timestamp {pd.Timestamp(times[position])} is off the "
                        f"{pd.Timedelta(step)} sampling grid")
    gaps = deltas != step
    if gaps.any() and not allow_gaps:
        position = int(np.flatnonzero(gaps)[0]) + 1
        missing = int(deltas[position - 1] // step) - 1
        raise DataError(f"{_where(frame, position)}: gap in timestamps, {missing} step(s) of {pd.Timedelta(step)} "
                        f"missing before {pd.Timestamp(times[position])} (or pass --set fill_gaps=interpolate)")
    return pd.Timedelta(step)


def parse_duration(value: int | str, step: pd.Timedelta, field: str) -> int:
    """Converts a duration ("1D", "7D", "24h") or a step count to a number of steps.

    Args:
        value: an integer number of steps, or a pandas duration string.
        step: the series' sampling interval.
        field: the config field, for error messages.

    Returns:
        A positive number of steps.

    Raises:
        DataError: the value is not a duration, or not a whole number of steps.
    """
    if isinstance(value, int):
        steps = value
    else:
        try:
            duration = pd.Timedelta(value)
        except ValueError:
            raise DataError(f"config field {field!r}: {value!r} is not a duration (e.g. 1D, 7D, 24h) "
                            "or a number of steps") from None
        if duration % step != pd.Timedelta(0):
            raise DataError(f"config field {field!r}: {value} is not a whole number of {step} steps")
        steps = int(duration // step)
    if steps < 1:
        raise DataError(f"config field {field!r}: {value!r} is less than one {step} step")
    return steps
