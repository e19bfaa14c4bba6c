"""torchvision and timm on the CPU torch of the tests.

They install here with --no-deps (their wheels are built for a CUDA torch): torchvision's
compiled operators do not load against the CPU torch, and only its ``_meta_registrations``
module needs them. A stand-in for that module, registered before the first ``import
torchvision``, makes torchvision's and timm's model definitions importable (plain Python on
the CPU torch), and so every package that imports torchvision when it is there (Lightning's
torchmetrics does). Without torchvision installed this changes nothing. Imported by
conftest.py and by every worker process the tests spawn.
"""

import sys
import types

sys.modules.setdefault("torchvision._meta_registrations",
                       types.ModuleType("torchvision._meta_registrations"))
