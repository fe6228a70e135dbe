"""Choosing a runtime: the decision record written from measured results.

:mod:`.operability` is the format of the operability measurements, :mod:`.choice` the
rule that picks a candidate per hardware track, :mod:`.record` the ``decide`` command
that writes the Markdown record.
"""
