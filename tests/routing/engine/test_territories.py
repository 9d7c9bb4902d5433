"""Territory lookup: matching, specificity, ties, and a cost that ignores the table's size."""

from __future__ import annotations

import pytest

from routing.engine import TerritoryIndex, TerritoryMatch, TerritorySpec
from routing.engine.territories import describe_miss

DACH = TerritorySpec(1, "DACH", ("DE", "AT", "CH"), team_id=1)
US = TerritorySpec(2, "US", ("US",), rep_id=1)
US_WEST = TerritorySpec(3, "US West", ("US",), regions=("CA", "WA", "OR"), rep_id=2)
BAY_AREA = TerritorySpec(4, "Bay Area", ("US",), postal_prefixes=("940", "941", "945"), rep_id=3)
SF = TerritorySpec(5, "SF", ("US",), postal_prefixes=("9410",), rep_id=4)
SF_CA = TerritorySpec(6, "SF CA", ("US",), regions=("CA",), postal_prefixes=("9410",), rep_id=5)

INDEX = TerritoryIndex([DACH, US, US_WEST, BAY_AREA, SF, SF_CA])


def chosen(
    index: TerritoryIndex, country: str, region: str | None, postal: str | None
) -> TerritoryMatch:
    match = index.lookup(country, region, postal)
    assert match is not None
    return match


def found(country: str | None, region: str | None = None, postal: str | None = None) -> str | None:
    match = INDEX.lookup(country, region, postal)
    return None if match is None else match.territory.name


@pytest.mark.parametrize(
    ("country", "region", "postal", "expected"),
    [
        ("DE", None, None, "DACH"),
        (" at ", "9", "1010", "DACH"),
        ("FR", None, None, None),
        (None, "CA", "94105", None),
        ("US", None, None, "US"),
        ("US", "NY", "10001", "US"),
        # a region match beats country-only
        ("US", "ca", None, "US West"),
        ("US", "CA", "90210", "US West"),
        # a postal prefix beats a region
        ("US", "CA", "94501", "Bay Area"),
        ("US", None, "94501", "Bay Area"),
        ("US", "NY", "94501", "Bay Area"),
        # the longest prefix wins; at equal length a region match wins
        ("US", "NY", "94105", "SF"),
        ("US", "CA", "94105", "SF CA"),
        ("US", None, " 94105 ", "SF"),
        # a prefix longer than the code does not match
        ("US", None, "94", "US"),
    ],
)
def test_most_specific_territory_wins(
    country: str | None, region: str | None, postal: str | None, expected: str | None
) -> None:
    assert found(country, region, postal) == expected


def test_a_territory_needs_all_of_its_set_criteria() -> None:
    index = TerritoryIndex(
        [TerritorySpec(1, "CA bay", ("US",), regions=("CA",), postal_prefixes=("94",), rep_id=1)]
    )
    assert index.lookup("US", "CA", "94105") is not None
    assert index.lookup("US", "NV", "94105") is None  # region set but not matched
    assert index.lookup("US", "CA", "89501") is None  # prefix set but not matched
    assert index.lookup("US", None, "94105") is None
    assert index.lookup("CA", "CA", "94105") is None  # wrong country


def test_remaining_ties_go_to_the_lowest_id_whatever_the_listed_order() -> None:
    specs = [
        TerritorySpec(9, "late country", ("DE",), rep_id=1),
        TerritorySpec(3, "early country", ("DE",), rep_id=2),
        TerritorySpec(8, "late region", ("DE",), regions=("BY",), rep_id=1),
        TerritorySpec(4, "early region", ("DE",), regions=("BY",), rep_id=2),
        TerritorySpec(7, "late prefix", ("DE",), postal_prefixes=("80",), rep_id=1),
        TerritorySpec(5, "early prefix", ("DE",), postal_prefixes=("80",), rep_id=2),
    ]
    for order in (specs, list(reversed(specs))):
        index = TerritoryIndex(order)
        assert chosen(index, "DE", None, None).territory.name == "early country"
        assert chosen(index, "DE", "BY", None).territory.name == "early region"
        assert chosen(index, "DE", "BY", "80331").territory.name == "early prefix"


def test_match_says_why_it_was_chosen() -> None:
    assert chosen(INDEX, "US", "CA", "94105").why == "postal prefix 9410, region CA"
    assert chosen(INDEX, "US", "NY", "94501").why == "postal prefix 945"
    assert chosen(INDEX, "US", "WA", None).why == "region WA"
    assert chosen(INDEX, "de", None, None).why == "country DE"


def test_a_miss_is_described() -> None:
    assert describe_miss("fr", None, None) == "no territory for country FR"
    assert (
        describe_miss("US", "ny", "10001")
        == "no territory for country US, region NY, postal code 10001"
    )
    assert describe_miss(None, "CA", "94105") == "no territory: the lead has no country"


def test_odd_values_never_crash() -> None:
    odd: tuple[object, ...] = (5, 3.5, True, [], {}, "", "  ")
    for value in odd:
        assert INDEX.lookup(value, value, value) is None
    assert TerritoryIndex().lookup("US", "CA", "94105") is None
    assert TerritoryIndex([TerritorySpec(1, "nowhere", (), rep_id=1)]).lookup("", "", "") is None


def test_lookup_probes_a_bounded_number_of_prefixes() -> None:
    # 100,000 prefixes for one country: a lookup still tries at most `longest prefix` slices.
    specs = [
        TerritorySpec(i, f"T{i}", ("US",), postal_prefixes=(f"{i:06d}",), rep_id=1)
        for i in range(1, 100_001)
    ]
    index = TerritoryIndex(specs)
    assert len(index) == 100_000
    probes: list[str] = []

    class Spy(dict[str, object]):
        def get(self, key: str, default: object = None) -> object:
            probes.append(key)
            return super().get(key, default)

    country = index._countries["US"]
    country.prefixes = Spy(country.prefixes)  # type: ignore[assignment]
    assert chosen(index, "US", None, "0123456789999").territory.name == "T12345"
    assert probes == ["012345"]
    probes.clear()
    assert index.lookup("US", None, "999999999") is None
    assert probes == ["999999", "99999", "9999", "999", "99", "9"]


@pytest.mark.parametrize(
    ("prefix", "postal"),
    [("SW1A", "sw1a 1aa"), ("SW1A 1", "SW1A1AA"), ("sw1a-1", "SW1A 1AA"), ("1010", " 10-10 ")],
)
def test_postal_codes_and_prefixes_match_ignoring_case_spaces_and_dashes(
    prefix: str, postal: str
) -> None:
    """UK and other postcodes are written with and without spaces; both sides are folded."""
    index = TerritoryIndex([TerritorySpec(1, "London", ("GB", "AT"), postal_prefixes=(prefix,))])
    country = "AT" if prefix.isdigit() else "GB"
    match = index.lookup(country, None, postal)
    assert match is not None
    assert match.territory.name == "London"
