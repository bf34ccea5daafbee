"""CSV tables and regular time series, validated with errors that name file, line and column, and the windows
of a series that a forecaster reads (chronological backtest splits, window origins, windows cut as they are read).

Time zones: timestamps with UTC offsets (``2024-03-31T02:00:00+01:00``) are read as
instants and the series lives on the UTC axis, so an hourly local series stays hourly
across a daylight-saving change. The series keeps a table of its UTC offsets
(``utc_offsets``), from ``timezone`` (an IANA name such as ``Europe/London``) when
given, else from the offsets in the file, so that calendar features and printed
forecasts use the series' own local time. Naive timestamps are wall-clock times; with
``timezone`` they are placed in that zone (a missing or ambiguous hour is an error).
"""
from __future__ import annotations

import csv
import dataclasses
import functools
import io
import re
import zoneinfo
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from seqapps.errors import ConfigError, DataError

FILL_METHODS = ("none", "interpolate", "ffill")
DECIMAL_MARKS = (".", ",")
SEPARATORS = ",;\t|"
_SNIFF_BYTES = 8192
_COMMA_NUMBER = r"\s*[+-]?\d+,\d*(?:[eE][+-]?\d+)?\s*"  # 12,5 with a decimal comma


def read_csv(path: str | Path, decimal: str = ".") -> pd.DataFrame:
    """Reads a UTF-8 CSV file with a header row, keeping every cell as text.

    The separator (comma, semicolon, tab or bar) is detected from the first lines,
    as European spreadsheets write semicolons. With ``decimal=","`` numbers such as
    ``12,5`` are read as 12.5.

    Args:
        path: the file to read.
        decimal: the decimal mark of numbers, "." or ",".

    Returns:
        A DataFrame of strings (empty cells are NaN), one row per data line;
        ``attrs["csv"]`` says which separator and decimal mark were used.

    Raises:
        DataError: the file is missing, binary, not UTF-8, empty, or has no data rows.
    """
    path = Path(path)
    if decimal not in DECIMAL_MARKS:
        raise ConfigError(f"config field 'decimal': got {decimal!r}, expected one of {' '.join(DECIMAL_MARKS)}")
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
    separator = _sniff_separator(text)
    if separator == decimal:
        raise DataError(f"{path}: the separator and the decimal mark are both {decimal!r}; "
                        "a file with decimal commas needs another separator (such as ;)")
    try:
        frame = pd.read_csv(io.StringIO(text), sep=separator, dtype=str, keep_default_na=False,
                            na_values=["", "NaN", "nan", "NA", "N/A", "null"])
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise DataError(f"{path}: not a readable CSV ({str(error).splitlines()[0]})") from None
    if frame.empty:
        raise DataError(f"{path}: has a header but no data rows")
    if decimal == ",":
        frame = frame.apply(lambda column: column.where(~column.str.fullmatch(_COMMA_NUMBER, na=False),
                                                        column.str.replace(",", ".", regex=False)))
    frame.attrs["source"] = str(path)
    frame.attrs["first_line"] = 2  # line 1 is the header
    frame.attrs["csv"] = {"separator": separator, "decimal": decimal}
    return frame


def _sniff_separator(text: str) -> str:
    """Returns the separator of a CSV text: the sniffed one, or a comma for a single column."""
    sample = "\n".join(text.splitlines()[:20])
    try:
        return csv.Sniffer().sniff(sample, delimiters=SEPARATORS).delimiter
    except csv.Error:
        return ","


@dataclasses.dataclass
class TimeSeries:
    """A regular time series.

    Attributes:
        frame: float64 columns indexed by a regular, increasing DatetimeIndex: UTC
            instants (as naive datetimes) when ``utc_offsets`` is set, else wall-clock times.
        step: the sampling interval.
        filled: how many values were filled (gaps and empty cells), when asked to.
        utc_offsets: ``[[start, offset], ...]`` in Unix seconds, sorted by start: from
            ``start`` on, local time is UTC + ``offset``. None for naive timestamps.
        timezone: where the offsets come from: an IANA name, "file offsets", or None.
    """

    frame: pd.DataFrame
    step: pd.Timedelta
    filled: int = 0
    utc_offsets: list[list[int]] | None = None
    timezone: str | None = None


_FIRST = -(2**62)  # the start of the first offset interval: before any timestamp
_OFFSET = re.compile(r"(?:Z|[+-]\d{2}(?::?\d{2})?)$")


def check_timezone(name: str | None, field: str = "timezone") -> None:
    """Raises ConfigError unless ``name`` is None or an IANA time zone name."""
    if name is None:
        return
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"config field {field!r}: {name!r} is not a time zone name "
                        "(expected an IANA name such as Europe/London or UTC)") from None


@functools.cache
def zone_offsets(name: str, first_year: int = 1970, last_year: int = 2100) -> tuple[tuple[int, int], ...]:
    """Returns a zone's UTC offset table ``((start, offset), ...)`` in Unix seconds.

    Args:
        name: an IANA time zone name.
        first_year, last_year: the years covered; outside them the nearest offset holds.
    """
    days = pd.date_range(f"{first_year}-01-01", f"{last_year}-01-01", freq="D", tz="UTC")
    offsets = _offsets_at(days, name)  # zones change offset at most once a day
    table = [(_FIRST, int(offsets[0]))]
    for i in np.flatnonzero(np.diff(offsets)) + 1:  # the change lies in (days[i-1], days[i]]
        start = days[i - 1]
        for unit in ("h", "min"):  # narrow it down to the hour, then to the minute
            grid = pd.date_range(start, start + pd.Timedelta("1D" if unit == "h" else "1h"), freq=unit)
            start = grid[int(np.flatnonzero(_offsets_at(grid, name) == offsets[i])[0]) - 1]
        table.append((int((start + pd.Timedelta("1min")).value // 10**9), int(offsets[i])))
    return tuple(table)


def _offsets_at(instants: pd.DatetimeIndex, name: str) -> np.ndarray:
    local = instants.tz_convert(name).tz_localize(None)
    return ((local - instants.tz_localize(None)) // pd.Timedelta("1s")).to_numpy()


def local_times(unix_seconds: np.ndarray, utc_offsets: list[list[int]]) -> list[pd.Timestamp]:
    """Returns the local times of UTC instants as offset-aware Timestamps (for printing)."""
    starts = np.array([start for start, _ in utc_offsets], "int64")
    offsets = np.array([offset for _, offset in utc_offsets], "int64")
    chosen = offsets[np.searchsorted(starts, unix_seconds, side="right") - 1]
    return [pd.Timestamp(int(t), unit="s", tz="UTC").tz_convert(_fixed_zone(int(o)))
            for t, o in zip(unix_seconds, chosen)]


def _fixed_zone(offset_seconds: int) -> Any:
    import datetime

    return datetime.timezone(datetime.timedelta(seconds=offset_seconds))


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
    timezone: str | None = None,
) -> TimeSeries:
    """Validates a table as a regular time series.

    Args:
        frame: a table from ``read_csv`` or an embedded source (``attrs["source"]`` names it).
        timestamp_col: the column of timestamps (any format pandas parses; with or
            without UTC offsets, but not a mix).
        value_cols: numeric columns to keep, in this order.
        fill_gaps: "none" (gaps and empty cells are errors), "interpolate" (linear in
            time) or "ffill" (carry the last value forward).
        timezone: the series' IANA time zone (None: the file's offsets, or none).

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

    check_timezone(timezone)
    times, utc_offsets, zone = _parse_timestamps(frame, timestamp_col, timezone)
    values = pd.DataFrame({column: _parse_numbers(frame, column, allow_empty=fill_gaps != "none")
                           for column in value_cols})
    values.index = pd.DatetimeIndex(times, name=timestamp_col)
    step = _check_order_and_step(frame, times, allow_gaps=fill_gaps != "none")

    if fill_gaps == "none":
        return TimeSeries(values, step, 0, utc_offsets, zone)
    full_index = pd.date_range(values.index[0], values.index[-1], freq=step, name=timestamp_col)
    values = values.reindex(full_index)
    filled = int(values.isna().to_numpy().sum())
    if fill_gaps == "interpolate":
        values = values.interpolate(method="time", limit_direction="both")
    else:
        values = values.ffill().bfill()
    return TimeSeries(values, step, filled, utc_offsets, zone)


def _parse_timestamps(frame: pd.DataFrame, column: str,
                      timezone: str | None) -> tuple[np.ndarray, list[list[int]] | None, str | None]:
    """Returns (times, utc_offsets, timezone source); see ``TimeSeries``."""
    text = frame[column]
    if pd.api.types.is_datetime64_any_dtype(text):  # an embedded table's parsed timestamps
        aware = text.dt.tz is not None
        parsed, wall = (text.dt.tz_convert("UTC"), text.dt.tz_localize(None)) if aware else (text, None)
    else:
        empty = text.isna()
        if empty.any():
            position = int(np.flatnonzero(empty.to_numpy())[0])
            raise DataError(f"{_where(frame, position)}: column {column!r} is empty, expected a date/time")
        has_offset = text.str.strip().str.contains(_OFFSET).to_numpy()
        if has_offset.any() and not has_offset.all():
            position = int(np.flatnonzero(has_offset != has_offset[0])[0])
            raise DataError(f"{_where(frame, position)}: column {column!r} value {text.iloc[position]!r} "
                            f"{'has no' if has_offset[0] else 'has a'} UTC offset, unlike line "
                            f"{_where(frame, 0).rpartition(' ')[2]}; give every timestamp an offset, or none")
        aware = bool(has_offset.all())
        parsed = pd.to_datetime(text, errors="coerce", format="mixed", utc=aware)
        wall = None
    bad = parsed.isna()
    if bad.any():
        position = int(np.flatnonzero(bad.to_numpy())[0])
        raise DataError(f"{_where(frame, position)}: column {column!r} value {text.iloc[position]!r} "
                        "is not a date/time (expected e.g. 2024-01-31 13:00)")
    if aware:
        utc = parsed.dt.tz_localize(None)
        if timezone is not None:
            return utc.to_numpy(), [list(row) for row in zone_offsets(timezone)], timezone
        if wall is None:
            wall = pd.to_datetime(text.str.strip().str.replace(_OFFSET, "", regex=True), format="mixed")
        return utc.to_numpy(), _file_offsets(wall, utc), "file offsets"
    if timezone is None:
        return parsed.to_numpy(), None, None  # naive wall-clock times
    return _localize(frame, column, parsed, timezone), [list(row) for row in zone_offsets(timezone)], timezone


def _file_offsets(wall: pd.Series, utc: pd.Series) -> list[list[int]]:
    """The offset table a file's own offsets give: each change takes effect at its row."""
    offsets = ((wall - utc) // pd.Timedelta("1s")).to_numpy()
    seconds = utc.to_numpy().astype("datetime64[s]").astype("int64")
    changes = np.flatnonzero(np.diff(offsets)) + 1
    return [[_FIRST, int(offsets[0])]] + [[int(seconds[i]), int(offsets[i])] for i in changes]


def _localize(frame: pd.DataFrame, column: str, parsed: pd.Series, timezone: str) -> np.ndarray:
    """Places naive wall-clock times in ``timezone``; returns UTC times."""
    missing = parsed.dt.tz_localize(timezone, ambiguous="NaT", nonexistent="NaT").isna().to_numpy()
    try:  # the row order tells which of a repeated hour's two instants each row is
        local = parsed.dt.tz_localize(timezone, ambiguous="infer", nonexistent="NaT")
    except Exception:  # noqa: BLE001 - pandas and pytz raise several kinds for an unresolvable hour
        local = None
    nonexistent = local.isna().to_numpy() if local is not None else np.zeros(len(parsed), bool)
    if nonexistent.any():
        position = int(np.flatnonzero(nonexistent)[0])
        raise DataError(f"{_where(frame, position)}: column {column!r} value {parsed.iloc[position]} does not exist "
                        f"in {timezone} (the clocks go forward then); add UTC offsets to the timestamps")
    if local is None:
        position = int(np.flatnonzero(missing)[0])
        raise DataError(f"{_where(frame, position)}: column {column!r} value {parsed.iloc[position]} occurs twice in "
                        f"{timezone} (the clocks go back) and the rows do not tell which; add UTC offsets")
    return local.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy()


def _parse_numbers(frame: pd.DataFrame, column: str, allow_empty: bool) -> np.ndarray:
    text = frame[column]
    numbers = pd.to_numeric(text, errors="coerce").astype("float64")
    not_numeric = numbers.isna() & text.notna()
    if not_numeric.any():
        position = int(np.flatnonzero(not_numeric.to_numpy())[0])
        hint = (" (for decimal commas pass --set decimal=,)"
                if re.fullmatch(_COMMA_NUMBER, str(text.iloc[position])) else "")
        raise DataError(f"{_where(frame, position)}: column {column!r} value {text.iloc[position]!r} is not a number"
                        + hint)
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
    for problem, message in ((deltas == zero, "duplicate timestamp {t} (same as the row before; a repeated "
                                              "hour of a daylight-saving change needs UTC offsets or "
                                              "--set timezone=NAME)"),
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
                        f"{format_duration(step)} sampling grid")
    gaps = deltas != step
    if gaps.any() and not allow_gaps:
        position = int(np.flatnonzero(gaps)[0]) + 1
        missing = int(deltas[position - 1] // step) - 1
        raise DataError(f"{_where(frame, position)}: gap in timestamps, {missing} step(s) of {format_duration(step)} "
                        f"missing before {pd.Timestamp(times[position])} (or pass --set fill_gaps=interpolate)")
    return pd.Timedelta(step)


def format_duration(duration: pd.Timedelta | np.timedelta64) -> str:
    """A duration as people write it: "15 min", "1 h", "36 h", "1 day", "7 days", "30 s" (messages, reports).

    Args:
        duration: a pandas or NumPy duration.

    Returns:
        The count in the largest of days, hours, minutes and seconds that divides it (fractions of a
        second as "0.25 s").
    """
    seconds = pd.Timedelta(duration).total_seconds()
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
        if seconds and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}" + ("s" if unit == "day" and count != 1 else "")
    return f"{seconds:g} s"


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
            raise DataError(f"config field {field!r}: {value} is not a whole number of {format_duration(step)} steps")
        steps = int(duration // step)
    if steps < 1:
        raise DataError(f"config field {field!r}: {value!r} is less than one {format_duration(step)} step")
    return steps


# --- Windows of a series: chronological splits, window origins, windows cut as they are read ----------------------


def numeric_columns(frame: pd.DataFrame, exclude: Sequence[str]) -> list[str]:
    """The columns of a table that hold mostly numbers (at least half of their non-empty cells).

    Args:
        frame: a table of text cells (``read_csv``) or of typed values.
        exclude: columns not to consider (the timestamp, the targets).

    Returns:
        Their names, in the table's order; ``to_time_series`` then validates every cell of them.
    """
    found = []
    for column in frame.columns:
        if column in exclude:
            continue
        present = frame[column].notna()
        if present.any() and pd.to_numeric(frame[column], errors="coerce")[present].notna().mean() >= 0.5:
            found.append(column)
    return found


def fold_bounds(rows: int, val_fraction: float, test_fraction: float,
                folds: int) -> list[dict[str, tuple[int, int]]]:
    """The row ranges ``[start, stop)`` of each backtest fold's splits, oldest fold first.

    The last fold is the ordinary chronological split of all rows. Each earlier fold
    ends one test split sooner: its series is cut there and split with the same
    validation and test lengths, so the folds' test splits tile the series' end.

    Args:
        rows: the length of the series.
        val_fraction, test_fraction: the split sizes, as fractions of ``rows``.
        folds: how many cut points.

    Returns:
        ``folds`` dicts mapping "train", "val", "test" to row ranges (train may be empty
        or negative for a short series: the caller checks).
    """
    n_test, n_val = int(round(rows * test_fraction)), int(round(rows * val_fraction))
    ends = [rows - (folds - 1 - k) * n_test for k in range(folds)]
    return [{"train": (0, end - n_val - n_test), "val": (end - n_val - n_test, end - n_test),
             "test": (end - n_test, end)} for end in ends]


def window_origins(start: int, stop: int, lookback: int, horizon: int) -> np.ndarray:
    """The windows whose targets lie in rows ``[start, stop)``.

    Args:
        start, stop: the split's rows.
        lookback: the steps each window reads, up to and including its origin.
        horizon: the steps after the origin it forecasts.

    Returns:
        The index t of each window's last observed step (its targets are rows t+1..t+horizon), int64.
    """
    first = max(start - 1, lookback - 1)
    return np.arange(first, stop - horizon, dtype="int64")


def cut_windows(series: np.ndarray, times: np.ndarray, origins: np.ndarray, columns: Sequence[str],
                targets: Sequence[int], lookback: int, horizon: int, batch_size: int | None = None,
                shift: tuple[np.ndarray, Callable[[dict[str, Any], Any], Any]] | None = None,
                time_key: str = "end_time") -> Any:
    """Windows ``(inputs, targets)`` of a series, cut as they are read (a ``tf.data.Dataset``).

    Only the series and the window origins are held, so memory grows with the
    series, not with the number of windows times the lookback.

    Args:
        series: float32 values, shape [rows, columns].
        times: the Unix time of each row, int64 [rows].
        origins: the index of each window's last observed step (``window_origins``).
        columns: the name of each column of ``series``: the inputs' keys.
        targets: the indices of the target columns.
        lookback, horizon: the steps each window reads and forecasts.
        batch_size: cut batches of this many windows; None: single windows (of known cardinality).
        shift: a key per window, shape [windows], and a function of a batch's inputs and keys that gives
            what to add to its targets, [batch, horizon, targets] (the targets then take its dtype);
            None: the series' values.
        time_key: the inputs' key of the window's last time.

    Returns:
        A dataset of ``({column: [lookback], time_key: []}, [horizon, targets])``, batched if asked.
    """
    import tensorflow as tf

    values, stamps = tf.constant(series), tf.constant(times)
    past = tf.range(1 - lookback, 1, dtype=tf.int64)
    future = tf.range(1, horizon + 1, dtype=tf.int64)

    def cut(origin: tf.Tensor, key: tf.Tensor | None = None) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        window = tf.gather(values, origin[:, None] + past)  # [batch, lookback, columns]
        inputs = {name: window[:, :, i] for i, name in enumerate(columns)}
        inputs[time_key] = tf.gather(stamps, origin)
        found = tf.gather(tf.gather(values, origin[:, None] + future), list(targets), axis=2)
        if key is None:
            return inputs, found
        offset = shift[1](inputs, key)
        return inputs, tf.cast(found, offset.dtype) + offset

    windows = tf.data.Dataset.from_tensor_slices(origins if shift is None else (origins, shift[0]))
    windows = windows.batch(batch_size or 1024).map(cut, num_parallel_calls=tf.data.AUTOTUNE)
    if batch_size is None:
        windows = windows.unbatch().apply(tf.data.experimental.assert_cardinality(len(origins)))
    return windows


def read_recent(path: str, timestamp_col: str, columns: Sequence[str], rows: int, step_seconds: int, *,
                timezone: str | None = None, with_offsets: bool = False, decimal: str = ".") -> pd.DataFrame:
    """The last ``rows`` rows of a series CSV that must match a series read before (``seqapps predict``).

    Args:
        path: the CSV file.
        timestamp_col, columns: its timestamp column and the value columns to keep, in order.
        rows: how many of its last rows are needed.
        step_seconds: the sampling interval it must have.
        timezone: as in ``to_time_series``.
        with_offsets: whether its timestamps must carry UTC offsets (or must not).
        decimal: its decimal mark.

    Returns:
        The last ``rows`` rows of ``columns``, indexed by time (as ``TimeSeries.frame``).

    Raises:
        DataError: a bad table, another sampling interval, timestamps with offsets where none are
            expected (or the reverse), or too few rows.
    """
    series = to_time_series(read_csv(path, decimal=decimal), timestamp_col, list(columns), timezone=timezone)
    step = pd.Timedelta(seconds=step_seconds)
    if (series.utc_offsets is not None) != with_offsets:
        raise DataError(f"{path}: timestamps {'have' if series.utc_offsets else 'lack'} UTC offsets; expected "
                        f"timestamps {'with' if with_offsets else 'without'} them, as the series trained on")
    if series.step != step:
        raise DataError(f"{path}: sampling interval is {format_duration(series.step)}, expected "
                        f"{format_duration(step)}")
    if len(series.frame) < rows:
        raise DataError(f"{path}: has {len(series.frame)} rows, expected the last {rows} rows or more "
                        f"({format_duration(step * rows)})")
    return series.frame.iloc[-rows:]
