"""timm (PyTorch Image Models) architectures by name: the model spec ``timm:NAME``.

``timm:resnet50`` builds ``timm.create_model("resnet50", pretrained=False)``, random
weights, under the trust rule of ``pathlift.models.loading``: a checkpoint may name a timm
architecture as it may a torchvision one, because building it runs timm's code, not the
file's. A spec is only a name timm lists (``timm.is_model``, a pretrained tag such as
``resnet50.a1_in1k`` included, which selects the declared input size), never a hub
address; the arguments that make timm read files or download (``pretrained``,
``checkpoint_path``, ...) are refused, so a file's constructor arguments cannot either.
Weights come from a checkpoint, ``--weights`` or ``load_weights``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from pathlift.errors import InvalidParameterError

PREFIX = "timm:"

#: create_model arguments that read files or download: never taken from a spec's kwargs
_LOADING = frozenset({"pretrained", "pretrained_cfg", "pretrained_cfg_overlay",
                      "checkpoint_path", "cache_dir"})


def is_timm_spec(name: object) -> bool:
    """Whether ``name`` reads ``timm:NAME``."""
    return isinstance(name, str) and name.startswith(PREFIX)


def timm_model(spec: str, **kwargs: Any) -> nn.Module:
    """``timm.create_model(NAME, pretrained=False, **kwargs)`` for ``spec`` = ``timm:NAME``.

    Raises:
        InvalidParameterError: timm not importable, a name timm does not list, an argument
            that would load weights, or arguments the architecture does not take.
    """
    name = spec[len(PREFIX):]
    timm = _timm()
    if not timm.is_model(name):
        raise InvalidParameterError(
            f"timm has no model {name!r}; list them with python -c \"import timm; "
            f"print(timm.list_models('{name.split('.')[0][:3]}*'))\"")
    loading = sorted(_LOADING & set(kwargs))
    if loading:
        raise InvalidParameterError(
            f"{spec}: pathlift builds timm models with random weights and does not take "
            f"{', '.join(loading)}; give the weights as a file (--weights FILE, "
            "load_model(spec, weights=FILE))")
    try:
        return timm.create_model(name, pretrained=False, **kwargs)
    except TypeError as err:
        raise InvalidParameterError(f"bad arguments {kwargs} for model '{spec}': {err}") \
            from err


def _timm() -> Any:
    try:
        import timm
    except Exception as err:  # absent, or present but broken against this torch build
        raise InvalidParameterError(
            f"timm:NAME needs timm, which does not import here "
            f"({str(err).splitlines()[0][:200] or type(err).__name__}): pip install timm") \
            from err
    return timm
