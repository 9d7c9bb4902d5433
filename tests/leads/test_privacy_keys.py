"""Per-person keys and sealing (leads/privacy.py): lookup hashes, wrap/unwrap, rotation, cache."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from hypothesis import given
from hypothesis import strategies as st

from leads import privacy
from leads.models import PersonKey

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    privacy.cache_clear()
    yield
    privacy.cache_clear()


def test_the_lookup_hash_is_keyed_normalised_and_never_the_address() -> None:
    a = privacy.lookup_hash(email=" Jane.Doe@Example.COM ")
    assert a == privacy.lookup_hash(email="jane.doe@example.com")
    assert "jane" not in a
    assert len(a) == 64
    assert privacy.lookup_hash(phone="+49 30 1234-567") == privacy.lookup_hash(phone="+49301234567")
    # The e-mail wins over the phone; another hash key gives another hash.
    assert privacy.lookup_hash(email="j@x.io", phone="+1555") == privacy.lookup_hash(email="j@x.io")
    with override_settings(PRIVACY_HASH_KEY="another"):
        assert privacy.lookup_hash(email="jane.doe@example.com") != a
    with pytest.raises(ValueError, match="e-mail or a phone"):
        privacy.lookup_hash(email=" ", phone="-")


@given(personal=json_values, trace=st.lists(json_values, max_size=4))
def test_sealed_values_open_to_what_was_sealed(personal: Any, trace: list[Any]) -> None:
    fernet = Fernet(Fernet.generate_key())
    value = {"data": personal, "trace": trace}
    sealed = privacy.seal(fernet, value)
    assert privacy.unseal(fernet, sealed) == value
    with pytest.raises(privacy.PrivacyKeyError):
        privacy.unseal(Fernet(Fernet.generate_key()), sealed)


@given(
    data=st.dictionaries(
        st.sampled_from(["reason", "summary", "error", "tags", "matched_on", "kind", "crm"]),
        json_values
        | st.dictionaries(
            st.sampled_from(["hubspot", "salesforce"]),
            st.dictionaries(
                st.sampled_from(["status", "person", "company", "person_owner", "reason"]),
                json_values,
            ),
        ),
    )
)
def test_split_then_merge_gives_the_data_back_and_the_plain_part_holds_nothing_personal(
    data: dict[str, Any],
) -> None:
    plain, personal = privacy.split_personal(data)
    assert privacy.merge_personal(plain, personal) == data
    assert not set(plain) & privacy.PERSONAL_DATA_KEYS
    if isinstance(plain.get("crm"), dict):
        for entry in plain["crm"].values():
            if isinstance(entry, dict):
                assert not set(entry) & privacy.PERSONAL_CRM_KEYS


@pytest.mark.django_db
def test_one_key_per_person_wrapped_by_the_master_key() -> None:
    first = privacy.person_key_for(email="Jane@Example.com")
    assert first is not None
    assert privacy.person_key_for(email="jane@example.com") == first
    assert privacy.person_key_for(phone="+4930123") != first
    assert privacy.person_key_for() is None
    row = PersonKey.objects.get(pk=first)
    assert row.lookup == privacy.lookup_hash(email="jane@example.com")
    assert "jane" not in (row.lookup or "") + (row.wrapped or "")
    fernet = privacy.person_fernet(first)
    assert fernet is not None
    # The wrapped value is not the data key itself: only the master key opens it.
    assert privacy.unseal(fernet, privacy.seal(fernet, {"x": 1})) == {"x": 1}


@pytest.mark.django_db
def test_an_erased_key_opens_nothing_and_the_cache_is_one_read_per_key() -> None:
    key_id = privacy.person_key_for(email="jane@example.com")
    assert key_id is not None
    privacy.cache_clear()  # a new key is cached as made (on PostgreSQL): start cold
    with CaptureQueriesContext(connection) as queries:
        for _ in range(5):
            assert privacy.person_fernet(key_id) is not None
    assert len(queries) == 1
    PersonKey.objects.filter(pk=key_id).update(wrapped=None, lookup=None)
    privacy.cache_clear()
    assert privacy.person_fernet(key_id) is None
    assert privacy.person_fernets({key_id}) == {key_id: None}


@pytest.mark.django_db
def test_rotation_old_data_readable_after_a_new_key_goes_first_then_rewrapped() -> None:
    old, new = privacy.new_master_key(), privacy.new_master_key()
    with override_settings(PRIVACY_KEYS=[old]):
        key_id = privacy.person_key_for(email="jane@example.com")
        assert key_id is not None
        fernet = privacy.person_fernet(key_id)
        assert fernet is not None
        sealed = privacy.seal(fernet, {"name": "Jane"})
    privacy.cache_clear()
    with override_settings(PRIVACY_KEYS=[new, old]):
        reopened = privacy.person_fernet(key_id)
        assert reopened is not None
        assert privacy.unseal(reopened, sealed) == {"name": "Jane"}
        assert privacy.rewrap_all() == 1
    privacy.cache_clear()
    with override_settings(PRIVACY_KEYS=[new]):  # the old key dropped after the re-wrap
        reopened = privacy.person_fernet(key_id)
        assert reopened is not None
        assert privacy.unseal(reopened, sealed) == {"name": "Jane"}
    privacy.cache_clear()
    with override_settings(PRIVACY_KEYS=[old]), pytest.raises(privacy.PrivacyKeyError):
        privacy.person_fernet(key_id)  # a master key lost: said as such, not "erased"
    with override_settings(PRIVACY_KEYS=["not a key"]), pytest.raises(privacy.PrivacyKeyError):
        privacy.person_key_for(email="other@example.com")


@pytest.mark.django_db
def test_the_rewrap_command_prints_a_key_and_rewraps() -> None:
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("privacy_rewrap", "--new-key", stdout=out)
    new = out.getvalue().strip()
    Fernet(new.encode())  # a valid key
    old = settings_keys()
    privacy.person_key_for(email="jane@example.com")
    with override_settings(PRIVACY_KEYS=[new, *old]):
        out = StringIO()
        call_command("privacy_rewrap", stdout=out)
    assert "re-wrapped 1 person key(s)" in out.getvalue()


def settings_keys() -> list[str]:
    from django.conf import settings

    return list(settings.PRIVACY_KEYS)


@pytest.mark.django_db
def test_the_background_rewrap_moves_keys_to_the_new_master_key_and_marks_lost_ones() -> None:
    """Rotation without a shell: beat's job re-wraps in batches; old data readable throughout."""
    from leads.models import PersonKey

    old, new, gone = privacy.new_master_key(), privacy.new_master_key(), privacy.new_master_key()
    sealed = {}
    with override_settings(PRIVACY_KEYS=[old]):
        for n in range(5):
            key_id = privacy.person_key_for(email=f"p{n}@example.com")
            assert key_id is not None
            fernet = privacy.person_fernet(key_id)
            assert fernet is not None
            sealed[key_id] = privacy.seal(fernet, {"n": n})
    with override_settings(PRIVACY_KEYS=[gone]):
        lost_id = privacy.person_key_for(email="lost@example.com")
    privacy.cache_clear()
    with override_settings(PRIVACY_KEYS=[new, old]):
        assert privacy.rewrap_pending().count() == 6
        assert privacy.rewrap_batch(batch=2) == (2, 0)  # bounded
        assert privacy.rewrap_pending().count() == 4
        done, lost = privacy.rewrap_scheduled(batch=2)
        assert (done, lost) == (3, 1)
        assert privacy.rewrap_pending().count() == 0
        assert PersonKey.objects.get(pk=lost_id).wrapped_by == privacy.LOST
        assert privacy.rewrap_scheduled() == (0, 0)  # nothing left: a no-op
        # The command tries the lost key again, and says which one fails.
        with pytest.raises(privacy.PrivacyKeyError, match=str(lost_id)):
            privacy.rewrap_all()
    privacy.cache_clear()
    with override_settings(PRIVACY_KEYS=[new]):  # the old key dropped after the re-wrap
        for key_id, text in sealed.items():
            fernet = privacy.person_fernet(key_id)
            assert fernet is not None
            assert privacy.unseal(fernet, text)["n"] in range(5)
    privacy.cache_clear()
