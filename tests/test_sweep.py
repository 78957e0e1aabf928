"""attnid.train.sweep: results in task order and byte-identical whatever the number of workers."""

from __future__ import annotations

import pytest

from attnid.train.sweep import check_jobs, run_sweep


def _small_run(seed: int) -> str:
    """A seeded torch computation with a reduction, formatted at full precision."""
    import torch

    g = torch.Generator().manual_seed(seed)
    a = torch.randn(40, 40, generator=g, dtype=torch.float64)
    return f"{seed} {float((a @ a.T).logsumexp(0).sum()):.17g} {torch.get_num_threads()}"


def test_order_and_values_do_not_depend_on_the_worker_count():
    tasks = [5, 3, 8, 1, 2, 9]
    one = run_sweep(_small_run, tasks, jobs=1)
    two = run_sweep(_small_run, tasks, jobs=2)
    assert one == two
    assert [int(r.split()[0]) for r in one] == tasks
    assert all(r.endswith(" 1") for r in two)  # one torch thread per worker


def test_bad_worker_counts_are_refused():
    for bad in (0, -2, 1.5, True, "2"):
        with pytest.raises(ValueError, match="jobs must be"):
            check_jobs(bad)
    with pytest.raises(ValueError, match="threads must be"):
        run_sweep(_small_run, [1], threads=0)
    assert check_jobs(-1) >= 1


@pytest.mark.slow
def test_the_same_sweep_on_a_local_dask_cluster():
    distributed = pytest.importorskip("distributed")
    tasks = [4, 0, 7]
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            distributed.Client(cluster):
        on_dask = run_sweep(_small_run, tasks, backend="dask")
    assert on_dask == run_sweep(_small_run, tasks, jobs=1)


def test_the_worker_count_from_the_environment(monkeypatch):
    from attnid.train.sweep import JOBS_VARIABLE, environment_jobs

    monkeypatch.delenv(JOBS_VARIABLE, raising=False)
    assert environment_jobs() == -1 and environment_jobs(default=3) == 3
    monkeypatch.setenv(JOBS_VARIABLE, " 2 ")
    assert environment_jobs() == 2
    for bad in ("two", "0", "1.5", "-3"):
        monkeypatch.setenv(JOBS_VARIABLE, bad)
        with pytest.raises(ValueError, match=JOBS_VARIABLE if bad in ("two", "1.5") else "jobs must be"):
            environment_jobs()


@pytest.mark.slow
def test_the_experiments_training_runs_do_not_depend_on_the_worker_count():
    # The tasks the experiments fan out (attnid.train.trainsweep.run_training and the rebalancing runs), small: the
    # same results, in task order, from one worker and from two.
    from attnid.train import rebalancing as RB
    from attnid.train.trainsweep import TrainRun, run_training

    training = [TrainRun("copy", 16, (2, 12, 8), "adam", 0.03, 6, 0, measure_every=2),
                TrainRun("teacher-student", 8, (2, 2, 0.0, "none"), "momentum", 0.05, 6, 1, measure_every=2),
                TrainRun("teacher-student", 8, (2, 2, 0.0, "none"), "adamw", 0.01, 6, 2, measure_every=3)]
    one, two = (run_sweep(run_training, training, jobs=jobs) for jobs in (1, 2))
    assert [repr(r) for r in one] == [repr(r) for r in two]  # repr: every float to its last bit, nan equal to nan
    settings = {"D_MODEL": 8, "TEACHER_HEADS": 2, "STUDENT": [4, 4, 0.0, "none"], "STEPS": 8, "BALANCE_EVERY": 3,
                "WEIGHT_DECAY": 0.01}
    runs = RB.tasks(settings, [(3.0, "sgd", 0.1, "none"), (3.0, "adamw", 0.01, "balance")], range(2))
    one, two = (run_sweep(RB.run, runs, jobs=jobs) for jobs in (1, 2))
    assert one == two
    assert [tuple(r[:5]) for r in one] == [(t.imbalance, t.optimiser, t.lr, t.variant, t.seed) for t in runs]


def _worker_address(task: int) -> str:
    """The address of the Dask worker running this task (raises outside a Dask worker)."""
    import distributed

    return distributed.get_worker().address


@pytest.mark.slow
def test_the_scheduler_variable_sends_every_sweep_to_that_cluster(monkeypatch):
    distributed = pytest.importorskip("distributed")
    from attnid.train import sweep

    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        monkeypatch.setenv(sweep.SCHEDULER_VARIABLE, cluster.scheduler_address)
        try:
            # the notebooks' call, unchanged: jobs from the environment (every core), no backend named
            addresses = run_sweep(_worker_address, [0, 1, 2, 3], jobs=-1)
            workers = sweep._CLIENTS[cluster.scheduler_address].scheduler_info()["workers"]
            assert len(workers) == 2 and set(addresses) <= set(workers)
            assert run_sweep(_small_run, [4, 0, 7], jobs=-1) == [_small_run(t) for t in (4, 0, 7)]
        finally:
            for client in sweep._CLIENTS.values():
                client.close()
            sweep._CLIENTS.clear()


def test_an_unreachable_scheduler_is_a_clear_error(monkeypatch):
    distributed = pytest.importorskip("distributed")
    from attnid.train import sweep

    monkeypatch.setenv(sweep.SCHEDULER_VARIABLE, "tcp://127.0.0.1:9")  # the discard port: nothing listens
    monkeypatch.setattr(sweep, "_CLIENTS", {})
    client = distributed.Client  # give up after 2 s instead of the library's 30: the same error path
    monkeypatch.setattr(distributed, "Client", lambda address, **kw: client(address, **{**kw, "timeout": "2s"}))
    with pytest.raises(RuntimeError, match="no Dask scheduler answers"):
        sweep.environment_backend()


def test_the_progress_bar_writes_to_the_process_stderr_not_to_stdout(monkeypatch, capsys):
    import io
    import sys

    terminal = io.StringIO()
    monkeypatch.setattr(sys, "__stderr__", terminal)
    assert run_sweep(_small_run, [1, 2], jobs=1, progress=True, desc="probe") == [_small_run(1), _small_run(2)]
    assert "probe" in terminal.getvalue() and "2/2" in terminal.getvalue()
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""  # what a notebook would store stays empty


def test_modules_only_the_workers_import_are_loaded_for_the_callers_provenance():
    """A runner that imports inside its body: the caller ends up with that module loaded too (its data's provenance)."""
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import sys\n"
        "import sweep_probe\n"
        "from attnid.train.sweep import run_sweep\n"
        "assert 'attnid.families.alibi' not in sys.modules, 'the probe needs a module the caller has not loaded'\n"
        "assert run_sweep(sweep_probe.lazy_count, [1, 2, 3], jobs=2) == [2, 4, 6]\n"
        "assert 'attnid.families.alibi' in sys.modules\n"
    )
    tests = Path(__file__).parent
    done = subprocess.run([sys.executable, "-c", script], cwd=tests, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(tests)})
    assert done.returncode == 0, done.stderr[-2000:]
