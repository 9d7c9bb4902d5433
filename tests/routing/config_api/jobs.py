"""Helpers for the configuration API's background jobs: a call answered 202 with a job, the
job run as the worker's task runs it (``maintenance.admin_job`` calls ``admin_job_run``), and
the job read back through the API."""

from __future__ import annotations

from typing import Any

from routing.admin_jobs import admin_job_run


def job_queued(response: Any) -> dict[str, Any]:
    """The job document of a 202 answer, checked against its Location."""
    assert response.status_code == 202, response.content
    job = response.json()
    assert response["Location"] == job["url"] == f"/api/v1/config/jobs/{job['id']}/"
    assert job["status"] == "queued"
    assert (job["result"], job["error"]) == (None, None)
    return dict(job)


def job_read(client: Any, job: dict[str, Any], secret: str) -> dict[str, Any]:
    response = client.get(job["url"], HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 200, response.content
    return dict(response.json())


def job_done(client: Any, response: Any, secret: str) -> dict[str, Any]:
    """Run the job a 202 answer queued as a worker would, and read it back ended."""
    job = job_queued(response)
    admin_job_run(job_id=job["id"])
    ended = job_read(client, job, secret)
    assert ended["status"] in ("done", "failed"), ended
    return ended
