"""Read traces back: one request's timeline from an OTLP export (``python -m
tritonforge.trace``)."""
