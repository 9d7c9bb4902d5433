"""CSV reading for batch intake: delimiter, encoding, preamble and report sections."""

from __future__ import annotations

import csv
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leads.parsing import IntakeError, Limits, decode_csv, parse_csv

LIMITS = Limits()


def read(content: str | bytes, max_records: int = 100) -> list[dict[str, str]]:
    return parse_csv(content, max_records=max_records, limits=LIMITS)


# --- delimiters ------------------------------------------------------------------------------


@pytest.mark.parametrize("delimiter", [",", ";", "\t", "|"])
def test_each_delimiter_is_detected(delimiter: str) -> None:
    text = delimiter.join(["Email", "Company", "Country"]) + "\r\n"
    text += delimiter.join(["ana@acme.de", "Acme GmbH", "Germany"]) + "\r\n"
    assert read(text) == [{"Email": "ana@acme.de", "Company": "Acme GmbH", "Country": "Germany"}]


def test_semicolons_win_over_commas_inside_cells() -> None:
    """German Excel: ";" between cells, "," inside a company name and a decimal."""
    text = "E-Mail;Firma;Umsatz\nj@gross.de;Groß, Maier & Co.;1,5\nk@x.de;Xaver AG;2,0\n"
    assert read(text) == [
        {"E-Mail": "j@gross.de", "Firma": "Groß, Maier & Co.", "Umsatz": "1,5"},
        {"E-Mail": "k@x.de", "Firma": "Xaver AG", "Umsatz": "2,0"},
    ]


def test_commas_win_over_semicolons_inside_cells() -> None:
    text = "email,note\na@b.co,first; second\nc@d.co,third; fourth\n"
    assert read(text) == [
        {"email": "a@b.co", "note": "first; second"},
        {"email": "c@d.co", "note": "third; fourth"},
    ]


def test_a_single_column_csv_still_reads() -> None:
    assert read("email\na@b.co\nc@d.co\n") == [{"email": "a@b.co"}, {"email": "c@d.co"}]


def test_quoted_newlines_and_delimiters_in_cells() -> None:
    text = 'Email;Comment\na@b.co;"line one\nline; two"\n'
    assert read(text) == [{"Email": "a@b.co", "Comment": "line one\nline; two"}]


# --- encodings -------------------------------------------------------------------------------


def test_utf8_with_and_without_bom() -> None:
    text = "Email,Name\nz@b.de,Zoë Bär\n"
    expected = [{"Email": "z@b.de", "Name": "Zoë Bär"}]
    assert read(text.encode()) == expected
    assert read(b"\xef\xbb\xbf" + text.encode()) == expected
    assert read("\ufeff" + text) == expected


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-le", "utf-16-be"])
def test_utf16_with_a_bom(codec: str) -> None:
    """Excel's "Unicode text": UTF-16 with a byte order mark, tab-separated."""
    text = "Email\tName\nk@sato.jp\t佐藤 健二\n"
    raw = text.encode("utf-16") if codec == "utf-16" else text.encode(codec)
    if codec == "utf-16-le":
        raw = b"\xff\xfe" + raw
    elif codec == "utf-16-be":
        raw = b"\xfe\xff" + raw
    assert read(raw) == [{"Email": "k@sato.jp", "Name": "佐藤 健二"}]


def test_windows_1252_is_the_fallback() -> None:
    raw = "Email;Firma;Preis\nj@gross.de;Groß GmbH;100 €\n".encode("cp1252")
    assert read(raw) == [{"Email": "j@gross.de", "Firma": "Groß GmbH", "Preis": "100 €"}]


def test_binary_that_is_no_text_is_refused() -> None:
    with pytest.raises(IntakeError) as caught:
        read(b"email\n\xff\xfe\n")
    assert caught.value.status == 400
    assert caught.value.code == "invalid_body"
    with pytest.raises(IntakeError):
        decode_csv(b"email\n\x81\x8d\n")  # bytes Windows-1252 does not define
    with pytest.raises(IntakeError):
        decode_csv(b"\xff\xfe\x00\xd8")  # a UTF-16 BOM, then a lone surrogate


# --- preamble and sections -------------------------------------------------------------------

ZOOM_ATTENDEES = """Attendee Report
Report Generated:,"03/14/2025 09:12:45 AM"
Topic,Webinar ID,Actual Start Time,Actual Duration (minutes),# Registered
RevOps Live,812 3456 7890,"03/13/2025 04:00:12 PM",62,4

Host Details
Attended,User Name (Original Name),Email,Join Time
Yes,Mara Host,mara@host.example,"03/13/2025 03:52:10 PM"

Panelist Details
Attended,User Name (Original Name),Email,Join Time
Yes,Tom Panel,tom@panel.example,"03/13/2025 03:55:02 PM"

Attendee Details
Attended,User Name (Original Name),First Name,Last Name,Email,Country/Region Name,
Yes,Jana Müller,Jana,Müller,jana@kontor.de,Germany,
No,Pierre L,Pierre,Lefèvre,p@atelier.fr,France,
"""


def test_title_rows_before_the_header_are_skipped() -> None:
    text = "Registration Report\nEvent ID:,4284671\n\nEmail,First Name\na@b.co,Ana\n"
    assert read(text) == [{"Email": "a@b.co", "First Name": "Ana"}]


def test_the_attendee_section_of_a_zoom_report_is_taken() -> None:
    assert read(ZOOM_ATTENDEES) == [
        {
            "Attended": "Yes",
            "User Name (Original Name)": "Jana Müller",
            "First Name": "Jana",
            "Last Name": "Müller",
            "Email": "jana@kontor.de",
            "Country/Region Name": "Germany",
        },
        {
            "Attended": "No",
            "User Name (Original Name)": "Pierre L",
            "First Name": "Pierre",
            "Last Name": "Lefèvre",
            "Email": "p@atelier.fr",
            "Country/Region Name": "France",
        },
    ]


def test_a_later_section_ends_the_records() -> None:
    text = (
        "Registrant Details\nEmail,First Name\na@b.co,Ana\n\n"
        "Poll Details\nEmail,Question,Answer\na@b.co,Q1,Yes\n"
    )
    assert read(text) == [{"Email": "a@b.co", "First Name": "Ana"}]


def test_without_a_known_field_the_first_row_is_the_header() -> None:
    """A CSV whose columns only the source's field map names."""
    assert read("Kundennr,Bemerkung\n4711,ruft zurück\n") == [
        {"Kundennr": "4711", "Bemerkung": "ruft zurück"}
    ]


def test_a_row_with_only_its_first_cell_filled_is_a_record() -> None:
    assert read("Email,Company\na@b.co,\nc@d.co,Dee\n") == [
        {"Email": "a@b.co"},
        {"Email": "c@d.co", "Company": "Dee"},
    ]


# --- the guarantees that were there before ---------------------------------------------------


def test_blank_cells_are_left_out_and_extra_cells_kept() -> None:
    assert read("email,company\na@b.co,,\nc@d.co,D,surplus\n") == [
        {"email": "a@b.co"},
        {"email": "c@d.co", "company": "D", "_extra_cells": ["surplus"]},
    ]


@pytest.mark.parametrize(
    "content",
    ["", "\n", "," * 1000, "email,email\na,b\n", 'email\n"unterminated'],
    ids=["empty", "blank", "commas", "repeated", "bad quote"],
)
def test_bad_csv_is_a_400(content: str) -> None:
    with pytest.raises(IntakeError) as caught:
        read(content)
    assert (caught.value.status, caught.value.code) == (400, "invalid_body")


def test_too_many_records_is_a_413() -> None:
    with pytest.raises(IntakeError) as caught:
        read("email\n" + "\n".join(f"p{i}@x.io" for i in range(11)), max_records=10)
    assert (caught.value.status, caught.value.code) == (413, "batch_too_large")
    assert len(read("email\n" + "\n".join(f"p{i}@x.io" for i in range(10)), 10)) == 10


def test_too_many_columns_is_a_400() -> None:
    header = ",".join(["email", *(f"c{i}" for i in range(LIMITS.max_keys))])
    with pytest.raises(IntakeError) as caught:
        read(header + "\na@b.co\n")
    assert caught.value.status == 400


# --- properties ------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=400))
def test_any_text_is_records_or_an_intake_error(text: str) -> None:
    try:
        records = read(text)
    except IntakeError as error:
        status = error.status
        records = []
    else:
        status = 202
    assert status in (202, 400, 413)
    assert all(isinstance(record, dict) for record in records)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_are_records_or_an_intake_error(raw: bytes) -> None:
    try:
        records = read(raw)
    except IntakeError as error:
        status = error.status
        records = []
    else:
        status = 202
    assert status in (202, 400, 413)
    assert all(isinstance(record, dict) for record in records)


_CELL = st.text(
    alphabet=st.characters(
        codec="utf-8", exclude_categories=("Cs", "Cc"), exclude_characters="\ufeff"
    ),
    max_size=12,
).filter(lambda cell: cell == cell.strip())


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(st.lists(_CELL, min_size=3, max_size=3), min_size=1, max_size=8),
    delimiter=st.sampled_from([",", ";", "\t", "|"]),
    encoding=st.sampled_from(["utf-8", "utf-8-sig", "utf-16"]),
)
def test_records_round_trip_through_each_delimiter_and_encoding(
    rows: list[list[str]], delimiter: str, encoding: str
) -> None:
    header = ["Email", "Company", "Country"]
    out = io.StringIO(newline="")
    writer = csv.writer(out, delimiter=delimiter, quoting=csv.QUOTE_ALL)
    writer.writerow(header)
    writer.writerows(rows)
    expected = [
        {name: cell for name, cell in zip(header, row, strict=True) if cell != ""}
        for row in rows
        if any(cell.strip() for cell in row)
    ]
    assert read(out.getvalue().encode(encoding)) == expected


@pytest.mark.parametrize("delimiter", [",", ";", "\t", "|"])
def test_windows_1252_round_trip(delimiter: str) -> None:
    rows = [["jürgen@groß.de", "Groß & Söhne", "Österreich"], ["é@à.fr", "Café €", "France"]]
    out = io.StringIO(newline="")
    writer = csv.writer(out, delimiter=delimiter)
    writer.writerow(["Email", "Company", "Country"])
    writer.writerows(rows)
    assert read(out.getvalue().encode("cp1252")) == [
        dict(zip(["Email", "Company", "Country"], row, strict=True)) for row in rows
    ]


def test_a_plain_csv_is_never_cut_short_by_a_row_that_looks_like_a_section_title() -> None:
    # Review finding: a one-cell row followed by a row holding a field-name answer ("Email")
    # ended the "section" and dropped the rest of a plain CSV.
    text = (
        "Email,Name,Preferred contact\n"
        "ana@acme.de,Ana,Phone\n"
        "kim@acme.de,,\n"
        "jo@x.de,Jo,Email\n"
        "max@y.de,Max,Phone\n"
    )
    records = parse_csv(text, max_records=100, limits=Limits())
    assert [r["Email"] for r in records] == ["ana@acme.de", "kim@acme.de", "jo@x.de", "max@y.de"]
