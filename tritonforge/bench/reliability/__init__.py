"""The reliability suite: scenarios that drive a running tritonserver and judge it.

Each scenario is one function that drives the server from 127.0.0.1 and returns a
:class:`~tritonforge.bench.reliability.verdict.Scenario`: a pass/fail verdict, the
criteria it was judged by and the figures it measured. ``make soak`` runs them at full
size (:mod:`tritonforge.bench.soak`), ``tests/e2e/test_reliability.py`` runs them small
against the test session's server; both call the same functions, so the CI check and
the committed figures measure the same thing.

By role: :mod:`.clients` (one bounded request over gRPC or HTTP, and how it ended),
:mod:`.probes` (what is read of the server besides its answers: engine metrics, memory,
processes, log), :mod:`.verdict` (the verdict and request figures every scenario
shares), :mod:`.models` (the default models and what each needs loaded), and one module
per scenario: :mod:`.mixed_load`, :mod:`.cancel_storm`, :mod:`.malformed`,
:mod:`.sigterm`.
"""
