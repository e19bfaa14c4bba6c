"""The jobs under the CLI: experiments that take names (a model, a data set), train, write
run folders, CSVs and figures, or launch processes. The library packages below compute and
return; these drive them. Import each job from its module (this face loads nothing):
``pathlift.jobs.prune`` (the prune-rewind-retrain protocol and its run folders),
``frontier`` (the accuracy/bound frontier), ``depth`` (the depth-limit tables), ``quant``
(``pathlift quantize``), ``transform`` (``pathlift rescale`` / ``normalize``), ``report``,
``bench`` (the Kronecker benchmark apps) and ``plots`` (every figure)."""
