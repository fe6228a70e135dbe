"""The engine-agnostic core of a request's life, free of Triton types.

``schema`` and ``sampling`` parse and validate; ``runtime`` runs the engine on its own
event loop and streams, cancels and ends every request exactly once; ``responses`` builds
what goes back; ``errors`` says how each failure reaches the client; ``cancellation``,
``restarts`` and ``dialects`` hold the smaller rules around them.
"""
