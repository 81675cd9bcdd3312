"""Names for radixlm's child processes in ``ps`` / ``top`` (SGLang names its own ``sglang::scheduler``
and so on): ``radixlm::scheduler_TP0``, ``radixlm::detokenizer``. Spawned children otherwise show
as ``python -c from multiprocessing.spawn import spawn_main ...``, which ``ps aux | grep radixlm``
does not find. Uses the setproctitle package; without it the title stays as it was.
"""

from __future__ import annotations

PREFIX = "radixlm::"


def set_process_title(name: str) -> None:
    """Set this process's title to ``radixlm::<name>`` (what ps, top and /proc/<pid>/cmdline show).

    The title is written over the original command line only (setproctitle's ``SPT_NOENV``): by
    default setproctitle also takes over the environment's memory, which blanks
    ``/proc/<pid>/environ`` (where one checks, e.g., the OpenMP settings a scheduler runs with).
    A spawned child's command line (``python -B -c from multiprocessing.spawn import ...``) is long
    enough for any of our titles."""
    import os

    added = "SPT_NOENV" not in os.environ
    if added:
        os.environ["SPT_NOENV"] = "1"
    try:
        import setproctitle

        setproctitle.setproctitle(PREFIX + name)
    except ImportError:
        pass
    finally:
        if added:
            os.environ.pop("SPT_NOENV", None)
