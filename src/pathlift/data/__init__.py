"""Data: the embedded sets (digits, synthetic), your own files and callables
(``load_data``; ``load_streamed``: an .npz's inputs left in the file), and loaders."""

from pathlift.data.embedded import Digits, Split, load_digits, loaders, synthetic
from pathlift.data.sources import NORMALIZATIONS, load_data
from pathlift.data.streamed import FileRows, labels_of, load_streamed

__all__ = ["NORMALIZATIONS", "Digits", "FileRows", "Split", "labels_of", "load_data",
           "load_digits", "load_streamed", "loaders", "synthetic"]
