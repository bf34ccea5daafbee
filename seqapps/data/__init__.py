"""Readers and validators for pipeline data; every failure is a typed ``DataError``."""
from seqapps.errors import DataError

__all__ = ["DataError"]
