"""Test configuration: under CI (CI=true) hypothesis runs a fixed, reproducible set of
examples, so a green or red CI does not depend on the draw."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
