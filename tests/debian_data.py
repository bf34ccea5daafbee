"""Tests of readers of optional packages (Debian corpora, soundfonts and synthesisers; pip ttspico, a C build):
CI installs them and must read them."""
import os
from typing import Any, Callable

import pytest

from seqapps.errors import DataError


def installed_or_skip(reader: Callable[[], Any], packages: str) -> Any:
    """Calls ``reader``; its DataError (a package missing) skips the test, except under CI
    (``SEQAPPS_REQUIRE_DEBIAN_DATA=1``, where ``.ci/run`` installed ``packages``), where it fails it.

    Args:
        reader: reads the installed data.
        packages: the Debian packages it needs, for the skip message.

    Returns:
        What ``reader`` returned.
    """
    try:
        return reader()
    except DataError:
        if os.environ.get("SEQAPPS_REQUIRE_DEBIAN_DATA") == "1":
            raise
        pytest.skip(f"not installed: {packages}")
