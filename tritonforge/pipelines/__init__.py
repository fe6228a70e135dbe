"""Logic of the models that chain others (a PII guard, guarded chat), without Triton types."""
