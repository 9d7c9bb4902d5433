"""A real worker process drains every queue the project declares, with no -Q flag."""

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
