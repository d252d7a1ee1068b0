"""Framework integrations: one callback each, over the same ``Run`` a raw loop uses.

Runs in: the training job's processes (every rank), inside the framework's hooks. Import
the framework's module, not this package: ``hpinteract.integrations.lightning`` needs
Lightning 2.x, ``hpinteract.integrations.transformers`` needs transformers 5.x (the
``hpinteract[lightning]`` and ``hpinteract[transformers]`` extras).
"""
