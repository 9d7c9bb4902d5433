"""Guards of the configuration API's background jobs found by review: a new source's one-time
token goes to who asked for the publish, a rollback does not undo a version published after it
was asked for, and a test job's lead-by-lead decisions need the draft scope, as the test. Each
failed before its fix."""

from __future__ import annotations

from typing import Any

import pytest

from routing.admin_jobs import admin_job_run
from tests.routing.config_api.jobs import job_queued, job_read
from tests.routing.config_api.test_config_jobs import (  # noqa: F401 (fixtures)
    BASE,
    _call,
    _draft,
    _token,
    published,
    secret,
)

pytestmark = pytest.mark.django_db


def test_a_publish_jobs_source_tokens_go_to_who_asked_not_to_another_users_token(
    client: Any,
    secret: str,  # noqa: F811 (the fixture)
) -> None:
    """The one-time secret of a new source belongs to the caller whose publish made it (the
    synchronous call answered it to them alone). Another person's publish token that polls the
    job URL first must not take it, leaving the caller with nothing."""
    draft_id = _draft(client, secret, {"sources": {"webinar-9": {"name": "Webinar 9"}}})
    job = job_queued(_call(client, "post", f"{BASE}drafts/{draft_id}/publish/", secret))
    admin_job_run(job_id=job["id"])
    someone_else = _token("publish", "someone-else")  # another user, own token
    taken = job_read(client, job, someone_else)["result"]["source_tokens"]
    mine = job_read(client, job, secret)["result"]["source_tokens"]
    assert taken == {}, "another user's token took the new source's secret"
    assert list(mine) == ["webinar-9"]


def test_a_queued_rollback_does_not_undo_a_publish_made_after_it_was_asked(
    client: Any,
    secret: str,  # noqa: F811 (the fixture)
) -> None:
    """A publish job is refused when its draft changed after it was asked for
    (``draft_changed``), so nothing other than what was asked for runs. A rollback job has no
    such guard: asked for while version 2 was live, run after a colleague published version 3
    (the maintenance queue backed up, a stalled job drained later, a client retrying its POST),
    it publishes version 1's document over version 3 and ends done; the colleague's change is
    gone without anyone being told ("Concurrent publishes ... serialised, the loser told
    why")."""
    from routing.drafts.models import ConfigSnapshot
    from routing.models import ValueList

    first = _draft(client, secret, {"value_lists": {"competitors": {"values": ["a.io"]}}})
    publish = _call(client, "post", f"{BASE}drafts/{first}/publish/", secret)
    admin_job_run(job_id=job_queued(publish)["id"])  # version 2 live
    rollback = job_queued(_call(client, "post", f"{BASE}versions/1/rollback/", secret))
    # Meanwhile a colleague publishes version 3 (it runs first).
    second = _draft(client, secret, {"value_lists": {"competitors": {"values": ["b.io"]}}})
    colleague = job_queued(_call(client, "post", f"{BASE}drafts/{second}/publish/", secret))
    admin_job_run(job_id=colleague["id"])
    assert ValueList.objects.get().values == ["b.io"]
    admin_job_run(job_id=rollback["id"])  # the rollback asked for before version 3
    ended = job_read(client, rollback, secret)
    values = ValueList.objects.get().values
    assert values == ["b.io"], f"version 3 silently rolled back ({ended['status']}): {values}"
    assert ConfigSnapshot.objects.count() == 3
    assert ended["status"] == "failed"
    assert ended["error"]["code"] == "configuration_changed", ended["error"]
    assert "version 3 was published after the rollback was asked for" in ended["error"]["message"]
    # Asked for again, now that version 3 is what it would undo, it runs.
    again = job_queued(_call(client, "post", f"{BASE}versions/1/rollback/", secret))
    admin_job_run(job_id=again["id"])
    assert job_read(client, again, secret)["status"] == "done"
    assert ValueList.objects.get().values == ["rival.io"]


def test_a_read_token_gets_no_lead_decisions_a_test_needs_draft_for(
    client: Any,
    secret: str,  # noqa: F811 (the fixture)
    settings: Any,
) -> None:
    """POST /drafts/<id>/test/ (the replay's lead-by-lead decisions) needs the draft scope; a
    read-only token is 403 there. The same test run as a job is readable by any read token,
    lead ids and owners included."""
    from tests.routing.config_api.test_config_jobs import _processed_leads

    _processed_leads(8)
    patch = {
        "teams": {"Other": {"members": [{"rep": "ben@example.com"}]}},
        "rules": {"Everyone": {"priority": 20, "action": {"type": "team", "team": "Other"}}},
    }
    draft_id = _draft(client, secret, patch)
    reader = _token("read", "reader")
    url = f"{BASE}drafts/{draft_id}/test/"
    assert _call(client, "post", url, reader, {"leads": 8}).status_code == 403
    settings.REPLAY_SYNC_MAX_LEADS = 5
    job = job_queued(_call(client, "post", url, secret, {"leads": 8}))
    admin_job_run(job_id=job["id"])
    seen = client.get(job["url"], HTTP_AUTHORIZATION=f"Bearer {reader}")
    leads = ((seen.json().get("result") or {}).get("replay") or {}).get("leads") or []
    assert seen.status_code == 403, leads[:1]
    assert seen.json()["error"]["code"] == "forbidden"
    assert client.get(job["url"], HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 200
