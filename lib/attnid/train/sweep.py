"""Independent runs of a sweep fanned out over processes with joblib, results in task order.

A sweep is a list of tasks (plain, picklable values) and a module-level function that turns one task
into one result. Every run is seeded by its task alone, and ``run_sweep`` returns the results in the
order of the tasks, so the data a sweep writes do not depend on the number of workers, nor on which
worker ran what. Each worker runs torch on ``threads`` threads (1 by default: the runs of the book's
experiments are small matrices, and one thread per run keeps a run's arithmetic the same whatever the
worker count).

``jobs=1`` runs in this process without joblib. ``jobs=-1`` uses every local core. Any other joblib
backend works through ``backend``: on a Dask cluster, create a ``distributed.Client`` and pass
``backend="dask"`` (with the default ``jobs=1``, every worker of the cluster is used), and the same
sweep runs on the cluster's workers unchanged. Without editing a notebook: set ``ATTNID_SCHEDULER``
to the address of a running Dask scheduler (``make experiments SCHEDULER=tcp://host:8786``), and every
sweep that names no backend connects to it and runs there.

A worker may import modules of the book's library that the calling process never did (a runner that
imports inside its body). Each worker reports the ``attnid``/``attnbook`` modules it has loaded, and
``run_sweep`` imports them here too, so the provenance of the data the caller writes
(``attnbook.provenance``: the modules loaded in the writing process) covers the code the runs used.

The progress bar (``progress=True``) counts finished runs on the process's own standard error
(``sys.__stderr__``): the terminal that started ``make experiments``, never a notebook's stored outputs.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

Task = TypeVar("Task")
Result = TypeVar("Result")


def check_jobs(jobs: int) -> int:
    """The number of worker processes ``jobs`` asks for: a positive int, or -1 for every local core."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or not (jobs == -1 or jobs >= 1):
        raise ValueError(f"jobs must be a positive integer or -1 (every core), got {jobs!r}")
    return (os.cpu_count() or 1) if jobs == -1 else jobs


JOBS_VARIABLE = "ATTNID_JOBS"  # the environment's worker count for a sweep (``make experiments JOBS=2`` sets it)


def environment_jobs(default: int = -1) -> int:
    """The worker count ``ATTNID_JOBS`` asks for (a positive integer, or -1 for every core), else ``default``.

    The experiments read their worker count here rather than from a notebook parameter: their data do not
    depend on it, so it is no part of what the data's provenance records.
    """
    text = os.environ.get(JOBS_VARIABLE, "").strip()
    if not text:
        return default
    try:
        jobs = int(text)
    except ValueError:
        raise ValueError(f"{JOBS_VARIABLE} must be a positive integer or -1 (every core), got {text!r}") from None
    check_jobs(jobs)
    return jobs


SCHEDULER_VARIABLE = "ATTNID_SCHEDULER"  # a Dask scheduler's address: every sweep without a backend runs there
_CLIENTS: dict[str, Any] = {}  # address -> the distributed.Client this process opened to it


def environment_backend() -> str | None:
    """'dask' after connecting a ``distributed.Client`` to ``ATTNID_SCHEDULER``'s address, or None when it is unset.

    The client becomes the process's default, which joblib's dask backend uses; later calls with
    the same address reuse it.
    """
    address = os.environ.get(SCHEDULER_VARIABLE, "").strip()
    if not address:
        return None
    if address not in _CLIENTS:
        import distributed

        try:
            _CLIENTS[address] = distributed.Client(address, timeout="30s", set_as_default=True)
        except OSError as error:
            raise RuntimeError(f"{SCHEDULER_VARIABLE}={address!r}: no Dask scheduler answers there ({error})") from None
    return "dask"


LIBRARY_PACKAGES = ("attnid", "attnbook")  # the packages whose modules a worker reports (provenance)


def library_modules() -> set[str]:
    """The names of the loaded modules of the book's library (``LIBRARY_PACKAGES``)."""
    return {name for name in list(sys.modules) if name.split(".")[0] in LIBRARY_PACKAGES}


def _run_one(fn: Callable[[Any], Any], task: Any, threads: int) -> tuple[Any, set[str]]:
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return fn(task), library_modules()


def _load(names: Iterable[str]) -> None:
    """Import every module of ``names`` this process has not loaded (a worker's: see the module docstring)."""
    for name in sorted(set(names) - set(sys.modules)):
        importlib.import_module(name)


def _progress(results: Iterable[Result], total: int, desc: str | None, progress: bool) -> Iterable[Result]:
    if not progress:
        return results
    from tqdm import tqdm

    return tqdm(results, total=total, desc=desc, file=sys.__stderr__, mininterval=5.0, unit="run")


def run_sweep(fn: Callable[[Task], Result], tasks: Sequence[Task], *, jobs: int = 1, backend: str | None = None,
              threads: int = 1, progress: bool = False, desc: str | None = None) -> list[Result]:
    """``[fn(t) for t in tasks]``, computed by ``jobs`` workers (or a joblib ``backend``), in task order.

    ``fn`` must be importable by the workers (a module-level function), and the tasks picklable.
    With no ``backend``, ``ATTNID_SCHEDULER`` may name a Dask cluster to run on (``environment_backend``).
    """
    workers = check_jobs(jobs)
    backend = backend or environment_backend()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    tasks = list(tasks)
    if workers == 1 and backend is None:
        return [_run_one(fn, t, threads)[0] for t in _progress(tasks, len(tasks), desc, progress)]
    import joblib

    # parallel_config, not Parallel(backend=...): it is what registers joblib's external backends (dask)
    # on a cluster, jobs 1 or -1 (the notebooks' default) means every worker of the cluster, not this machine's cores
    with joblib.parallel_config(backend=backend or "loky", n_jobs=-1 if backend and jobs in (1, -1) else workers):
        results = joblib.Parallel(return_as="generator")(joblib.delayed(_run_one)(fn, t, threads) for t in tasks)
        pairs = list(_progress(results, len(tasks), desc, progress))
    _load(set().union(*(loaded for _, loaded in pairs)))
    return [result for result, _ in pairs]
