"""tritonforge: Triton Inference Server backends for LLM serving.

Request path: Triton → ``backends/<engine>/model.py`` → :mod:`tritonforge.triton_model`
(the Triton edge) → :mod:`tritonforge.schema` / :mod:`tritonforge.sampling` (parse and
validate) → :mod:`tritonforge.runtime` (event loop, streaming, cancellation) →
``tritonforge.engines.<engine>`` (the only place that imports an engine).
"""

import locale as _locale


def _ensure_utf8_locale() -> None:
    """Make text I/O UTF-8 inside Triton's python stub.

    The stub embeds an isolated interpreter that never calls ``setlocale``, so files
    open as ASCII whatever ``LANG`` says, and importing vLLM/torch (UTF-8 sources and
    templates) fails. Setting LC_CTYPE here fixes every later ``open()``.
    Triton 2.51 workaround W6, see docs/triton-2.51-workarounds.md.
    """
    if _locale.getpreferredencoding(False).lower().replace("-", "") == "utf8":
        return
    for name in ("C.UTF-8", "C.utf8", "en_US.UTF-8"):
        try:
            _locale.setlocale(_locale.LC_CTYPE, name)
            return
        except _locale.Error:
            continue


_ensure_utf8_locale()
