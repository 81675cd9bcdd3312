"""Names for radixlm's child processes in ``ps`` / ``top`` (SGLang names its own ``sglang::scheduler``
and so on): ``radixlm::scheduler_TP0``, ``radixlm::detokenizer``. Spawned children otherwise show
as ``python -c from multiprocessing.spawn import spawn_main ...``, which ``ps aux | grep radixlm``
does not find. Uses the setproctitle package; without it the title stays as it was.
"""

from __future__ import annotations

PREFIX = "radixlm::"


def set_process_title(name: str) -> None:
    """Set this process's title to ``radixlm::<name>`` (what ps, top and /proc/<pid>/cmdline show)."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(PREFIX + name)
