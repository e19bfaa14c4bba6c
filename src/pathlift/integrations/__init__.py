"""Integrations with training frameworks; each module needs its framework installed
(``pathlift.integrations.lightning``: ``pip install 'pathlift[lightning]'``)."""
