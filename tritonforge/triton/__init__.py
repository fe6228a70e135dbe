"""The Triton edge: the only code that touches Triton's Python backend API.

``model`` binds an engine to ``TritonPythonModel``; ``embedding`` binds an embedding
engine to a non-decoupled, batched one; ``tensors`` is the tensor list both
the model config and the repository tool read; ``metrics`` exports Prometheus families;
``server_watch`` and ``reaper`` notice a stopping server and orphaned engine processes.
"""
