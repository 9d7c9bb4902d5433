"""leads.normalize, issue 16 §6: countries in any language, regions by English and local names.

Pure functions, no database. The country names come from CLDR through Babel, the subdivision
names from pycountry's ISO 3166-2 data and its iso-codes translations, plus a small table of
English exonyms that those lack.
"""

from __future__ import annotations

import json
import subprocess
import sys
import unicodedata

import pycountry
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import leads.normalize as normalize_module
from leads.normalize import (
    _SUBDIVISION_EXONYMS,
    _fold,
    _fold_place,
    normalize,
    normalize_country,
    normalize_region,
)

# --- countries in other languages and scripts -------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # German, Spanish, and the languages of Switzerland
        ("Deutschland", "DE"),
        ("deutschland", "DE"),
        ("DEUTSCHLAND", "DE"),
        ("España", "ES"),
        ("Espana", "ES"),
        ("Österreich", "AT"),
        ("Oesterreich", None),  # a transliteration, not a name CLDR has
        ("Schweiz", "CH"),
        ("Suisse", "CH"),
        ("Svizzera", "CH"),
        ("Svizra", "CH"),
        # more European languages
        ("Brasil", "BR"),
        ("Nederland", "NL"),
        ("Niederlande", "NL"),
        ("Pays-Bas", "NL"),
        ("Polska", "PL"),
        ("Italia", "IT"),
        ("Sverige", "SE"),
        ("Česko", "CZ"),
        ("Cesko", "CZ"),
        ("Tschechien", "CZ"),
        ("Türkiye", "TR"),
        ("Türkei", "TR"),
        ("Magyarország", "HU"),
        ("Magyarorszag", "HU"),
        ("Norge", "NO"),
        ("Danmark", "DK"),
        ("Suomi", "FI"),
        ("België", "BE"),
        ("Belgique", "BE"),
        ("Éire", "IE"),
        ("Hrvatska", "HR"),
        ("Lietuva", "LT"),
        ("Eesti", "EE"),
        ("Lëtzebuerg", "LU"),
        ("Allemagne", "DE"),
        ("Alemania", "DE"),
        ("Germania", "DE"),
        ("Niemcy", "DE"),
        ("Tyskland", "DE"),
        ("Royaume-Uni", "GB"),
        ("Vereinigtes Königreich", "GB"),
        ("Vereinigte Staaten", "US"),
        ("Estados Unidos", "US"),
        ("États-Unis", "US"),
        ("Etats Unis", "US"),
        ("México", "MX"),
        ("Perú", "PE"),
        ("Việt Nam", "VN"),
        # Cyrillic, Greek, Hebrew, Arabic, Devanagari, CJK and Hangul
        ("Россия", "RU"),
        ("Германия", "DE"),
        ("Україна", "UA"),
        ("България", "BG"),
        ("Србија", "RS"),
        ("Srbija", "RS"),
        ("Ελλάδα", "GR"),
        ("Ελβετία", "CH"),
        ("ישראל", "IL"),
        ("مصر", "EG"),
        ("भारत", "IN"),
        ("日本", "JP"),
        ("ドイツ", "DE"),
        ("スペイン", "ES"),
        ("中国", "CN"),
        ("德国", "DE"),
        ("台灣", "TW"),
        ("대한민국", "KR"),
        ("독일", "DE"),
        # short names that are not plain ASCII are names
        ("Çin", "CN"),
        ("Irã", "IR"),
        # padded and in a sentence-like casing
        ("  Deutschland  ", "DE"),
        ("The Nederland", "NL"),
    ],
)
def test_a_country_named_in_any_language_cldr_knows(value, expected):
    assert normalize_country(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # CLDR names two countries so across languages: no one country is meant.
        ("Kongo", None),
        # A continent's name in some languages (019 Americas) and the US's in others.
        ("Amerika", None),
        ("America", None),
        ("Europa", None),
        ("Korea", None),
        # pycountry's own names come first: Congo is the Republic of the Congo there.
        ("Congo", "CG"),
        # A sub-continental region's name in one language (018 Southern Africa) is still the
        # country that everybody else means by it.
        ("Afrique du Sud", "ZA"),
        ("Sudáfrica", "ZA"),
        # Short plain-ASCII names are not looked up in other languages: "end" is India in one,
        # "Man" the Isle of Man, "Sin" China, "Ira" Iran.
        ("end", None),
        ("Man", None),
        ("Sin", None),
        ("Ira", None),
        # and codes stay codes only when written as codes
        ("N/A", None),
        ("U.S.", "US"),
        ("no", "NO"),
        # not countries in any language
        ("Unknown Region", None),
        ("Europäische Union", None),
        ("Welt", None),
        ("Narnia", None),
    ],
)
def test_ambiguous_and_non_country_names(value, expected):
    assert normalize_country(value) == expected


def test_a_lead_with_a_localised_country_gets_its_code_and_a_phone_hint():
    lead = normalize(
        {"Land": "x", "country": "Deutschland", "state": "Bavaria", "tel": "030 1234567"}
    )
    assert lead.fields == {"phone": "+49301234567", "country": "DE", "region": "BY"}
    assert lead.custom == {"Land": "x"}
    assert lead.flags == ()


# --- regions by their English, local and other-language names --------------------------------


@pytest.mark.parametrize(
    ("value", "country", "expected"),
    [
        # English names from pycountry's iso-codes translations
        ("Bavaria", "DE", "BY"),
        ("bavaria", "Deutschland", "BY"),
        ("Thuringia", "DE", "TH"),
        ("Hesse", "DE", "HE"),
        ("Vienna", "AT", "9"),
        ("Tyrol", "AT", "7"),
        ("Styria", "Österreich", "6"),
        ("Carinthia", "AT", "2"),
        ("Zurich", "CH", "ZH"),
        ("Geneva", "CH", "GE"),
        ("Lucerne", "CH", "LU"),
        ("Grisons", "CH", "GR"),
        ("St. Gallen", "CH", "SG"),
        ("Catalonia", "ES", "CT"),
        ("Andalusia", "ES", "AN"),
        ("Navarre", "ES", "NC"),
        ("Lombardy", "IT", "25"),
        ("Piedmont", "IT", "21"),
        ("Sardinia", "IT", "88"),
        ("Apulia", "IT", "75"),
        ("Corsica", "FR", "20R"),
        ("Occitania", "FR", "OCC"),
        ("Wallonia", "BE", "WAL"),
        ("Masovia", "PL", "14"),
        # English exonyms from the table (in no library)
        ("Lower Saxony", "DE", "NI"),
        ("North Rhine-Westphalia", "DE", "NW"),
        ("north rhine westphalia", "DE", "NW"),
        ("Rhineland-Palatinate", "DE", "RP"),
        ("Saxony", "DE", "SN"),
        ("Lower Austria", "AT", "3"),
        ("Basel-City", "CH", "BS"),
        ("Basque Country", "ES", "PV"),
        ("Canary Islands", "España", "CN"),
        ("Tuscany", "IT", "52"),
        ("Sicily", "Italia", "82"),
        ("Brittany", "FR", "BRE"),
        ("Normandy", "FR", "NOR"),
        ("Flanders", "BE", "VLG"),
        ("Brussels", "Belgique", "BRU"),
        ("North Holland", "NL", "NH"),
        ("South Holland", "Nederland", "ZH"),
        ("Lesser Poland", "PL", "12"),
        ("Silesia", "Polska", "24"),
        # local names, with or without accents and case
        ("Bayern", "DE", "BY"),
        ("Baden-Württemberg", "DE", "BW"),
        ("baden wurttemberg", "DE", "BW"),
        ("Niederösterreich", "AT", "3"),
        ("Niederoesterreich", "AT", None),  # a transliteration no source has
        ("Île-de-France", "FR", "IDF"),
        ("ile de france", "FR", "IDF"),
        ("Catalunya", "ES", "CT"),
        ("Cataluña", "ES", "CT"),  # the Castilian name in the ISO name's brackets
        ("Cataluna", "ES", "CT"),
        ("Islas Baleares", "ES", "IB"),
        ("Comunidad de Madrid", "ES", "MD"),
        ("Madrid", "ES", "MD"),  # the community, not the province of the same name
        ("Région wallonne", "BE", "WAL"),
        ("Łódzkie", "PL", "10"),
        ("Lodzkie", "PL", "10"),
        ("Śląskie", "PL", "24"),
        ("Slaskie", "PL", "24"),
        ("Fryslân", "NL", "FR"),
        ("Friesland", "NL", "FR"),
        # other languages' names, other scripts
        ("Bavière", "DE", "BY"),
        ("Baviera", "DE", "BY"),
        ("Beieren", "DE", "BY"),
        ("Genf", "CH", "GE"),
        ("Andalousie", "ES", "AN"),
        ("Бавария", "DE", "BY"),
        # codes as before
        ("BY", "DE", "BY"),
        ("DE-BY", "Deutschland", "BY"),
        ("9", "AT", "9"),
        # still nothing for what names no subdivision
        ("Venice", "IT", None),
        ("Narnia", "DE", None),
        ("Bavaria", "AT", None),
        ("Bavaria", None, None),
    ],
)
def test_regions_by_english_local_and_other_language_names(value, country, expected):
    assert normalize_region(value, country) == expected


@pytest.mark.parametrize(
    ("code", "name"),
    [(code, name) for code, names in _SUBDIVISION_EXONYMS.items() for name in names],
)
def test_each_english_exonym_maps_to_its_real_pycountry_subdivision(code, name):
    assert pycountry.subdivisions.get(code=code) is not None, code
    alpha_2, _, suffix = code.partition("-")
    assert normalize_region(name, alpha_2) == suffix


@pytest.fixture
def without_the_exonym_table(monkeypatch):
    monkeypatch.setattr(normalize_module, "_SUBDIVISION_EXONYMS", {})
    normalize_module._subdivision_other_names.cache_clear()
    yield
    normalize_module._subdivision_other_names.cache_clear()


def test_each_english_exonym_is_needed(without_the_exonym_table):
    # The table only fills gaps: what pycountry's names and translations already know is not
    # copied into it.
    known = [
        (code, name)
        for code, names in _SUBDIVISION_EXONYMS.items()
        for name in names
        if normalize_region(name, code[:2]) is not None
    ]
    assert known == []


def test_the_exonym_table_covers_the_countries_named_in_the_issue():
    countries = {code[:2] for code in _SUBDIVISION_EXONYMS}
    assert countries == {"DE", "AT", "CH", "ES", "IT", "FR", "BE", "NL", "PL"}


def test_a_lead_with_an_english_region_name():
    lead = normalize({"country": "Spain", "state": "Catalonia"})
    assert lead.fields == {"country": "ES", "region": "CT"}
    assert lead.flags == ()


# --- folding place names -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Łódź", "Lodz"),
        ("Færøerne", "Faeroerne"),
        ("Baden-Württemberg", "baden wurttemberg"),
        ("Île-de-France", "ILE DE FRANCE"),
        ("Großbritannien", "Grossbritannien"),
    ],
)
def test_place_names_fold_alike(a, b):
    assert _fold_place(a) == _fold_place(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("ಟೋಗೋ", "ಟೊಂಗಾ"),  # Togo and Tonga in Kannada: its vowel signs are letters
        ("ジョージア", "ショーシア"),  # kana voicing marks are letters too
        ("नेपाल", "नपल"),
    ],
)
def test_marks_that_are_letters_are_kept(a, b):
    assert _fold_place(a) != _fold_place(b)
    assert _fold(a) == _fold(b)  # what the generic fold does, and why places have their own


_EARLY_SCRIPT_TEXT = st.text(
    st.characters(max_codepoint=0x08FF).filter(
        lambda ch: ch not in "łŁøØæÆœŒđĐðÐħĦıþÞ" and unicodedata.category(ch) != "Cs"
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(_EARLY_SCRIPT_TEXT)
def test_place_folding_is_the_generic_folding_before_devanagari(text):
    # So codes and the English and Latin-script names fold exactly as they always did.
    assert _fold_place(text) == _fold(text)


# --- properties --------------------------------------------------------------------------------

_property = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_NAMES = st.sampled_from(
    ["Deutschland", "日本", "Kongo", "Amerika", "Çin", "N/A", "U.S.", "Россия", "España", "end"]
)
_json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40)
)
_json_values = st.recursive(
    _json_scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=6,
)


@_property
@given(_NAMES | _json_values | st.text(st.characters(min_codepoint=0x0900), max_size=12))
def test_normalize_country_never_raises_and_is_idempotent(value):
    code = normalize_country(value)
    assert code is None or (len(code) == 2 and normalize_country(code) == code)


@_property
@given(
    st.sampled_from(["Bavaria", "Cataluña", "Łódzkie", "Бавария", "BY", "Flanders"]) | _json_values,
    st.sampled_from([None, "DE", "Deutschland", "ES", "PL", "BE", "日本", "Kongo"]),
)
def test_normalize_region_never_raises_and_is_idempotent(value, country):
    region = normalize_region(value, country)
    assert region is None or normalize_region(region, country) == region


# --- cost: built lazily, and without keeping Babel's locale data -------------------------------

_PROBE = """
import json, time
from babel import localedata
import leads.normalize as n
n.normalize_country("Germany"); n.normalize_country("DE"); n.normalize_region("Bayern", "DE")
lazy = n._localised_country_index.cache_info().currsize == 0
lazy_regions = n._subdivision_catalogues.cache_info().currsize == 0
cached = len(localedata._cache)
start = time.perf_counter()
n.normalize_country("Deutschland")
n.normalize_region("Bavaria", "DE")
print(json.dumps({
    "lazy": lazy,
    "lazy_regions": lazy_regions,
    "built": n._localised_country_index.cache_info().currsize == 1,
    "babel_cache_growth": len(localedata._cache) - cached,
    "names": len(n._localised_country_index()),
    "seconds": time.perf_counter() - start,
}))
"""


def test_the_localised_indexes_are_built_on_first_need_and_keep_no_babel_locale_data():
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    probe = json.loads(out)
    # pycountry's names needed neither index
    assert probe["lazy"], probe
    assert probe["lazy_regions"], probe
    assert probe["built"], probe
    # Locale.parse(...).territories would have cached every locale's data (over 200 MB).
    assert probe["babel_cache_growth"] <= 1, probe
    assert probe["names"] > 20_000, probe
