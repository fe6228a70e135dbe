"""The exit-cost suite: what an application written against one runtime must change to
move to another, measured at their OpenAI-compatible endpoints.

Why it lives outside every runtime: it is the application's side of the contract. It
sends golden requests to any base URL and judges only what an application depends on —
the prompt tokens the chat template gives, what a request without ``max_tokens`` or
``temperature`` does, stop sequences, ``json_schema`` output, a tool call's shape,
streamed usage, an adapter by name, the metric names a dashboard queries — never a
model's exact words. Each check is recorded as passed / failed / unsupported / not run
with its evidence and the *behaviour* an application observes; two candidates' behaviours
side by side give the changes a move between them costs (:mod:`.changes`).

    python -m tritonforge.bench exit-cost --base-url URL --model NAME --candidate NAME --out DIR
    python -m tritonforge.bench exit-cost-report DIR
"""
