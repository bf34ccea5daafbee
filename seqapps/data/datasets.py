"""Embedded default datasets, read offline from installed packages.

Each reader returns a table whose ``attrs["source"]`` names where it came from,
so validation errors point at it as they would at a user's CSV.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

WEATHER_COLUMNS = ["temp_air", "temp_dew", "relative_humidity", "pressure", "wind_speed"]


def tmy3_weather(station_file: str = "723170TYA.CSV") -> pd.DataFrame:
    """Hourly typical-year weather shipped with pvlib (BSD-3), 8,760 rows.

    The file is read with ``pvlib.iotools.read_tmy3``; the typical year joins months
    from different years, so it is stamped as one calendar year (1990) in local
    standard time.

    Args:
        station_file: a TMY3 file name inside ``pvlib/data``.

    Returns:
        Columns ``timestamp`` and ``WEATHER_COLUMNS`` (deg C, deg C, %, mbar, m/s).
    """
    import pvlib

    path = Path(pvlib.__file__).parent / "data" / station_file
    data, _ = pvlib.iotools.read_tmy3(str(path), map_variables=True, coerce_year=1990)
    frame = data[WEATHER_COLUMNS].reset_index(drop=True)
    frame.insert(0, "timestamp", data.index.tz_localize(None))
    frame.attrs["source"] = f"pvlib/data/{station_file}"
    return frame


def taylor_load() -> pd.DataFrame:
    """Half-hourly electricity demand (MW) in England and Wales from 5 June 2000, 12 weeks.

    From ``pmdarima.datasets.load_taylor`` (MIT), which returns the bare series;
    the timestamps are those of Taylor (2003).

    Returns:
        Columns ``timestamp`` and ``demand``; 4,032 rows.
    """
    from pmdarima.datasets import load_taylor

    demand = load_taylor()
    frame = pd.DataFrame({"timestamp": pd.date_range("2000-06-05", periods=len(demand), freq="30min"),
                          "demand": demand.astype("float64")})
    frame.attrs["source"] = "pmdarima load_taylor"
    return frame
