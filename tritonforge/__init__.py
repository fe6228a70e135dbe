"""tritonforge: Triton Inference Server backends for LLM serving.

The tree follows a request: Triton → ``backends/<engine>/model.py`` →
:mod:`tritonforge.triton` (the edge: the only code that touches Triton's API) →
:mod:`tritonforge.serving` (parse and validate, run, stream, cancel, answer) →
:mod:`tritonforge.engines` (one adapter per engine, the only place that imports one).
Beside it: :mod:`tritonforge.pipelines` (guard, guarded chat), :mod:`tritonforge.openai`
(the OpenAI API in front), :mod:`tritonforge.repo` (the repository tool),
:mod:`tritonforge.launch` (prepare and run a server) and :mod:`tritonforge.bench`
(evaluation contracts and the reliability suite).
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
