"""Territory lookup through an index built once: country -> longest postal prefix / region.

A territory matches a lead when the lead's country is one of its ``countries`` and, where set,
the lead's region is one of its ``regions`` and its postal code starts with one of its
``postal_prefixes``. The most specific match wins: the longest matching postal prefix, then a
region match, then a country-only match; a remaining tie goes to the lowest territory id.
A lookup tries the lead's own postal-code prefixes from longest to shortest (bounded by the
longest prefix any territory of that country uses), so it costs the same for 10 territories as for
100,000 prefixes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from routing.engine.types import TerritorySpec


def _code(value: Any) -> str:
    return value.strip().upper() if isinstance(value, str) else ""


def _postal(value: Any) -> str:
    """A postal code or prefix compared without case, spaces or dashes ("sw1a 1aa" = "SW1A1AA")."""
    return (
        "".join(ch for ch in value.upper() if not ch.isspace() and ch != "-")
        if isinstance(value, str)
        else ""
    )


@dataclass(frozen=True, slots=True)
class TerritoryMatch:
    """The territory chosen for a lead and what made it the most specific."""

    territory: TerritorySpec
    why: str  # "postal prefix 941", "region CA", "country US"


@dataclass(slots=True)
class _CountryIndex:
    # prefix -> [(territory, its regions or None)], region-restricted first, then by id
    prefixes: dict[str, list[tuple[TerritorySpec, frozenset[str] | None]]] = field(
        default_factory=dict
    )
    longest_prefix: int = 0
    regions: dict[str, TerritorySpec] = field(default_factory=dict)  # region-only territories
    country_only: TerritorySpec | None = None


class TerritoryIndex:
    """All territories, indexed for lookups whose cost does not grow with their number."""

    __slots__ = ("_countries", "_size")

    def __init__(self, territories: Iterable[TerritorySpec] = ()) -> None:
        self._countries: dict[str, _CountryIndex] = {}
        self._size = 0
        # Lowest id first, so "first one kept" below is the spec's tie-break.
        for territory in sorted(territories, key=lambda t: t.id):
            self._size += 1
            regions = frozenset(filter(None, map(_code, territory.regions))) or None
            prefixes = {p for p in map(_postal, territory.postal_prefixes) if p}
            for country in {c for c in map(_code, territory.countries) if c}:
                index = self._countries.setdefault(country, _CountryIndex())
                if prefixes:
                    for prefix in prefixes:
                        index.prefixes.setdefault(prefix, []).append((territory, regions))
                        index.longest_prefix = max(index.longest_prefix, len(prefix))
                elif regions is not None:
                    for region in regions:
                        index.regions.setdefault(region, territory)
                elif index.country_only is None:
                    index.country_only = territory
        for index in self._countries.values():
            for entries in index.prefixes.values():
                # Same prefix length: a region match beats none; then the lowest id (stable sort).
                entries.sort(key=lambda entry: entry[1] is None)

    def __len__(self) -> int:
        return self._size

    def lookup(self, country: Any, region: Any, postal_code: Any) -> TerritoryMatch | None:
        """The most specific territory for a lead's country, region and postal code, if any."""
        index = self._countries.get(_code(country))
        if index is None:
            return None
        region_code = _code(region)
        postal = _postal(postal_code)
        for length in range(min(len(postal), index.longest_prefix), 0, -1):
            prefix = postal[:length]
            entries = index.prefixes.get(prefix)
            if entries is None:
                continue
            for territory, regions in entries:
                if regions is None:
                    return TerritoryMatch(territory, f"postal prefix {prefix}")
                if region_code in regions:
                    return TerritoryMatch(
                        territory, f"postal prefix {prefix}, region {region_code}"
                    )
        if region_code:
            regional = index.regions.get(region_code)
            if regional is not None:
                return TerritoryMatch(regional, f"region {region_code}")
        if index.country_only is not None:
            return TerritoryMatch(index.country_only, f"country {_code(country)}")
        return None


def describe_miss(country: Any, region: Any, postal_code: Any) -> str:
    """Why no territory matched, in plain words."""
    country_code = _code(country)
    if not country_code:
        return "no territory: the lead has no country"
    parts = [f"country {country_code}"]
    if _code(region):
        parts.append(f"region {_code(region)}")
    if _postal(postal_code):
        parts.append(f"postal code {_postal(postal_code)}")
    return "no territory for " + ", ".join(parts)
