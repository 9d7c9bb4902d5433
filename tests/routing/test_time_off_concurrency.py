"""Two overlapping absences for one rep saved at the same time (PostgreSQL, real transactions)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone

from routing.models import Rep
from routing.timeoff.models import RepAbsence
from routing.timeoff.services import rep_absence_save

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_overlapping_absences_saved_at_once_one_is_refused() -> None:
    rep = Rep.objects.create(email="ana@example.com", name="Ana", timezone="Europe/Berlin")
    now = timezone.now()
    first_saved = threading.Event()
    outcomes: dict[str, object] = {}

    def first() -> None:
        try:
            with transaction.atomic():
                rep_absence_save(
                    absence=RepAbsence(
                        rep_id=rep.pk,
                        starts_at=now + timedelta(days=1),
                        ends_at=now + timedelta(days=5),
                    ),
                    actor="hr-sync",
                )
                first_saved.set()
                # Still uncommitted: the second save checks for overlaps meanwhile.
                time.sleep(1.0)
            outcomes["first"] = "saved"
        except BaseException as exc:
            outcomes["first"] = exc
            first_saved.set()
        finally:
            connection.close()

    def second() -> None:
        try:
            assert first_saved.wait(20)
            rep_absence_save(
                absence=RepAbsence(
                    rep_id=rep.pk,
                    starts_at=now + timedelta(days=3),
                    ends_at=now + timedelta(days=8),
                ),
                actor="admin",
            )
            outcomes["second"] = "saved"
        except BaseException as exc:
            outcomes["second"] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert outcomes["first"] == "saved"
    assert isinstance(outcomes["second"], ValidationError), outcomes
    assert "overlaps" in str(outcomes["second"])
    assert RepAbsence.objects.filter(rep=rep).count() == 1


def test_the_reps_admin_page_waits_for_an_absence_being_saved_and_refuses_the_overlap() -> None:
    from django.contrib.auth.models import User
    from django.test import Client

    rep = Rep.objects.create(email="ben@example.com", name="Ben", timezone="UTC")
    user = User.objects.create_superuser("rita", "rita@example.com", "pw")
    now = timezone.now()
    first_saved = threading.Event()
    outcomes: dict[str, object] = {}

    def sync() -> None:
        try:
            with transaction.atomic():
                rep_absence_save(
                    absence=RepAbsence(
                        rep_id=rep.pk,
                        starts_at=now + timedelta(days=1),
                        ends_at=now + timedelta(days=5),
                    ),
                    actor="hr-sync",
                )
                first_saved.set()
                time.sleep(1.5)  # uncommitted while the admin's form checks for overlaps
        except BaseException as exc:
            outcomes["sync"] = exc
            first_saved.set()
        finally:
            connection.close()

    def admin() -> None:
        try:
            client = Client()
            client.force_login(user)
            url = f"/admin/routing/rep/{rep.pk}/change/"
            assert client.get(url).status_code == 200  # warm: the POST below is quick
            assert first_saved.wait(20)
            start = (now + timedelta(days=3)).strftime("%Y-%m-%d %H:%M")
            end = (now + timedelta(days=8)).strftime("%Y-%m-%d %H:%M")
            data = {
                "email": rep.email,
                "name": rep.name,
                "active": "on",
                "timezone": "UTC",
                "working_hours": "",
                "absences-TOTAL_FORMS": "1",
                "absences-INITIAL_FORMS": "0",
                "absences-MIN_NUM_FORMS": "0",
                "absences-MAX_NUM_FORMS": "1000",
                "absences-0-starts_local": start,
                "absences-0-ends_local": end,
                "absences-0-note": "",
                "absences-0-rep": str(rep.pk),
            }
            response = client.post(url, data)
            outcomes["admin"] = (response.status_code, response.content.decode())
        except BaseException as exc:
            outcomes["admin"] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=sync), threading.Thread(target=admin)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert "sync" not in outcomes, outcomes
    status, page = outcomes["admin"]  # type: ignore[misc]
    assert status == 200, page[:2000]  # the form again, with the error (not a redirect)
    assert "overlaps" in page
    assert RepAbsence.objects.filter(rep=rep).count() == 1
