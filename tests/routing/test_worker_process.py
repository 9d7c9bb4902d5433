"""A real worker process drains every queue the project declares, with no -Q flag."""

import os
import sys
from pathlib import Path

import pytest

from config.celery import app
from routing.models import QueueHeartbeat
from routing.tasks import heartbeat
from tests.support.processes import celery_worker, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def test_a_worker_with_no_flags_consumes_every_declared_queue():
    queues = [q.name for q in app.conf.task_queues]
    with celery_worker(concurrency=1) as worker:
        for queue in queues:
            heartbeat.apply_async(args=[queue], queue=queue)
        # Rows a backlog check made for queues not drained yet have no worker: wait for workers.
        wait_until(
            lambda: QueueHeartbeat.objects.filter(worker__contains="@test-").count() == len(queues),
            timeout=60,
            message=lambda: f"not every queue was drained:\n{worker.text()[-3000:]}",
        )
    seen = dict(QueueHeartbeat.objects.exclude(worker="").values_list("queue", "worker"))
    assert set(seen) == set(queues)
    assert all("@test-" in name for name in seen.values()), seen


@pytest.mark.slow
def test_a_worker_whose_filesystem_broker_folder_vanished_exits_with_an_error(tmp_path):
    """Issue 23, item 1: `var/` removed under a running worker (a `make clean`, a deleted test
    folder) must stop it, non-zero, with a line saying why."""
    import shutil

    from tests.support.processes import BIN, child_env, start

    broker = tmp_path / "broker"
    env = child_env(
        CELERY_BROKER_URL="filesystem://",
        LEADROUTER_BROKER_DIR=str(broker),
        CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT="1",
    )
    worker = start(
        [str(BIN / "celery"), "-A", "config", "worker", "--loglevel", "INFO", "--concurrency", "1"],
        env,
    )
    try:
        worker.wait_for_output(" ready.", timeout=60)
        shutil.rmtree(broker)
        try:
            returncode = worker.popen.wait(timeout=60)
        except Exception:
            raise AssertionError(
                f"the worker kept running without its broker folder:\n{worker.text()[-3000:]}"
            ) from None
    finally:
        worker.stop(timeout=10)
    assert returncode != 0, worker.text()[-3000:]
    # One clear line naming the folder, not only a traceback from deep inside kombu.
    assert f"the filesystem broker's folder {broker / 'queue'} is gone" in worker.text(), (
        worker.text()[-3000:]
    )


def _niceness(pid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, pid)


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after it.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_worker_processes_run_at_the_configured_lower_priority():
    """Issue 18: routing yields the CPU to the web processes that accept a spike. The worker and
    its pool processes run at WORKER_NICE; this test process (the web's stand-in) is unchanged."""
    own = _niceness(0)
    target = min(19, own + 7)
    with celery_worker(concurrency=2, extra_env={"WORKER_NICE": str(target)}) as worker:
        wait_until(lambda: len(_children(worker.popen.pid)) >= 2, 30)
        pool = _children(worker.popen.pid)
        assert _niceness(worker.popen.pid) == target, worker.text()[-2000:]
        assert [_niceness(pid) for pid in pool] == [target] * len(pool)
    assert _niceness(0) == own


def test_worker_nice_default_is_lower_than_the_web():
    from config.settings import base

    assert 0 < base.WORKER_NICE <= 19
