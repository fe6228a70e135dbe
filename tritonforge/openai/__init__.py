"""An OpenAI-compatible HTTP API in front of the LLM models of a Triton server.

Each request becomes one Triton gRPC streaming call to the model named by the body's
``model`` (model id = Triton model name), speaking the shared request schema of
README.md ("Inputs and outputs of every LLM model"). The modules follow the request:

- :mod:`~tritonforge.openai.protocol`: the request bodies (pydantic; extra keys allowed);
- :mod:`~tritonforge.openai.translate`: a body → the model's input tensors, and the
  model's outputs → OpenAI's response and chunk objects (pure, unit-tested);
- :mod:`~tritonforge.openai.responses`: those objects, typed with OpenAI's field names
  (pydantic): the wire contract every answer, chunk and error is written from;
- :mod:`~tritonforge.openai.triton_client`: the shared asyncio gRPC client, the model
  catalogue (which models take the schema) and one stream per request, cancellable;
- :mod:`~tritonforge.openai.errors`: OpenAI's error shape and the mapping from Triton
  error messages to HTTP status codes;
- :mod:`~tritonforge.openai.app`: the FastAPI routes, SSE and client-disconnect handling.
- :mod:`~tritonforge.openai.shutdown`: the graceful stop (a grace period for the
  requests in flight, an answer for those it outlasts).

Run it with ``python -m tritonforge.openai --triton-grpc HOST:PORT``.
"""
