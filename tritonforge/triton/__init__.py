"""The Triton edge: the only code that touches Triton's Python backend API.

``model`` binds an engine to ``TritonPythonModel``; ``tensors`` is the tensor list both
the model config and the repository tool read; ``metrics`` exports Prometheus families;
``server_watch`` and ``reaper`` notice a stopping server and orphaned engine processes.
"""
