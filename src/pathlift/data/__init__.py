"""Data: the embedded sets (digits, synthetic), your own files and callables
(``load_data``), and loaders."""

from pathlift.data.embedded import Digits, Split, load_digits, loaders, synthetic
from pathlift.data.sources import NORMALIZATIONS, load_data

__all__ = ["NORMALIZATIONS", "Digits", "Split", "load_data", "load_digits", "loaders",
           "synthetic"]
