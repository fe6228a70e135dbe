"""The generated reference pages under docs/reference/, written from the code's own tables.

``python -m tritonforge.reference`` writes them; ``--check`` exits 1 when a page differs
from what the code would write (tests/unit/test_reference.py runs the same comparison).
"""
