"""routing.tasks: a chunk processes every id, and the soft time limit stops it."""

from __future__ import annotations

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from routing import tasks


def test_soft_time_limit_stops_the_chunk(monkeypatch):
    seen: list[str] = []

    def fake_process(*, lead_id: str) -> None:
        seen.append(lead_id)
        if lead_id == "b":
            raise SoftTimeLimitExceeded()

    monkeypatch.setattr(tasks, "lead_process", fake_process)
    with pytest.raises(SoftTimeLimitExceeded):
        tasks.process_leads(["a", "b", "c"])
    assert seen == ["a", "b"]


def test_one_failure_does_not_stop_the_others(monkeypatch, caplog):
    seen: list[str] = []

    def fake_process(*, lead_id: str) -> None:
        seen.append(lead_id)
        if lead_id == "b":
            raise RuntimeError("boom")

    monkeypatch.setattr(tasks, "lead_process", fake_process)
    tasks.process_leads(["a", "b", "c"])
    assert seen == ["a", "b", "c"]
    assert "1 of 3 lead(s) in a chunk failed" in caplog.text


def test_every_id_of_a_long_chunk_is_processed(monkeypatch):
    seen: list[str] = []
    monkeypatch.setattr(tasks, "lead_process", lambda *, lead_id: seen.append(lead_id))
    ids = [f"lead-{i}" for i in range(1500)]
    tasks.process_leads(ids)
    assert seen == ids
