"""Localised column names are aliases (review of issue 16, S1): a German Excel export is read."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leads.models import Lead
from leads.normalize import _ALIASES, _LOCALISED_ALIASES, _fold, canonical_key, normalize
from leads.services import lead_apply_normalization
from tests.leads.conftest import auth

ALL_ALIASES = sorted(
    {
        (target, alias)
        for table in (_ALIASES, _LOCALISED_ALIASES)
        for target, aliases in table.items()
        for alias in aliases
    }
)


@pytest.mark.django_db
def test_a_german_csv_through_the_batch_intake(client, source, published):
    body = (
        "Vorname;Nachname;E-Mail;Firma;Land;Telefon\r\n"
        "Ana;Müller;ana@acme.de;Acme GmbH;Deutschland;030 1234567\r\n"
    ).encode()
    response = client.post(
        "/api/v1/intake/webform/batch/", data=body, content_type="text/csv", **auth()
    )
    assert response.status_code == 202, response.content
    assert response.json()["accepted"] == 1
    lead = lead_apply_normalization(lead=Lead.objects.get())  # the worker's step
    assert (lead.first_name, lead.last_name, lead.email) == ("Ana", "Müller", "ana@acme.de")
    assert (lead.company, lead.country, lead.phone) == ("Acme GmbH", "DE", "+49301234567")
    assert lead.custom == {}


@pytest.mark.parametrize(
    ("header", "target"),
    [
        ("Prénom", "first_name"),
        ("Nom", "last_name"),
        ("Courriel", "email"),
        ("Société", "company"),
        ("Pays", "country"),
        ("Téléphone", "phone"),
        ("Code postal", "postal_code"),
        ("Ville", "city"),
        ("Région", "region"),
        ("Fonction", "title"),
        ("Apellidos", "last_name"),
        ("Correo electrónico", "email"),
        ("Empresa", "company"),
        ("País", "country"),
        ("Teléfono", "phone"),
        ("Código postal", "postal_code"),
        ("Ciudad", "city"),
        ("Provincia", "region"),
        ("Cargo", "title"),
        ("PLZ", "postal_code"),
        ("Ort", "city"),
        ("Bundesland", "region"),
        ("Berufsbezeichnung", "title"),
        ("Voornaam", "first_name"),
        ("Achternaam", "last_name"),
        ("Bedrijfsnaam", "company"),
        ("Cognome", "last_name"),
        ("Azienda", "company"),
        ("Città", "city"),
        ("Sobrenome", "last_name"),
        ("Cidade", "city"),
        ("CEP", "postal_code"),
    ],
)
def test_localised_headers(header, target):
    assert canonical_key(header) == target


@pytest.mark.parametrize("header", ["Nome", "Apelido", "Estado", "Staat", "Titel", "CAP", "CP"])
def test_ambiguous_words_are_no_alias(header):
    assert canonical_key(header) is None


def test_spanish_nombre_with_apellidos_is_the_first_name():
    fields = normalize({"Nombre": "Ana", "Apellidos": "García López"}).fields
    assert (fields["first_name"], fields["last_name"]) == ("Ana", "García López")


@given(
    st.sampled_from(ALL_ALIASES),
    st.sampled_from([str.upper, str.lower, str.title, lambda s: s]),
    st.sampled_from([" ", "_", "-", ""]),
)
def test_every_alias_names_exactly_one_target(pair, case, separator):
    """An alias, however it is cased or spaced, reads as its own target and no other."""
    target, alias = pair
    owners = {t for t, a in ALL_ALIASES if _fold(a) == _fold(alias)}
    assert owners == {target}
    assert canonical_key(case(alias.replace(" ", separator))) == target
