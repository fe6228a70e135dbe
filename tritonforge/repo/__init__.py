"""Write and check Triton model repositories for tritonforge's engines.

``python -m tritonforge.repo add|list|check``. A model directory is generated from a
few choices (engine, model path, name, instances) and checked before Triton sees it:
the mistakes that otherwise surface as a stub traceback minutes into a load (a typo in
an engine argument, a model directory without ``config.json``, an unset ``$VAR``) are
reported here, per model, in the user's terms.

Modules: ``engines`` (what differs per engine), ``paths`` (``$VAR`` and portable
paths), ``pbtxt`` (config.pbtxt text out, parsed configs in), ``generate`` (``add``),
``checks`` (``check``/``list``), ``cli`` (argparse).
"""
