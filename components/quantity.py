"""Kubernetes resource quantities: parsing and comparison (pure functions, no Pulumi)."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
            "P": Decimal(10**15), "E": Decimal(10**18)}
_QUANTITY = re.compile(r"^(?P<num>[0-9]+(\.[0-9]+)?|\.[0-9]+)(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][0-9]+)?$")


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: str | int | float) -> Decimal:
    """Return the quantity's value in base units (bytes, cores).

    >>> parse_quantity("128Gi") == 128 * 2**30
    True
    >>> parse_quantity("500m")
    Decimal('0.500')
    """
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        raise QuantityError(
            f"{value!r} is not a Kubernetes quantity (examples: '32', '500m', '128Gi', '1.5Ti')"
        )
    try:
        number = Decimal(match["num"])
    except InvalidOperation as exc:  # pragma: no cover - the regex already guarantees a number
        raise QuantityError(f"{value!r} is not a number") from exc
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix[:1] in ("e", "E"):
        return number * (Decimal(10) ** int(suffix[1:]))
    return number * _DECIMAL[suffix]


def gib(value: str | int | float) -> Decimal:
    """The quantity expressed in GiB."""
    return parse_quantity(value) / _BINARY["Gi"]


def format_gib(amount: Decimal | float | int) -> str:
    """Round a byte count up to whole GiB and format it as a quantity ('13Gi')."""
    whole = math.ceil(Decimal(amount) / _BINARY["Gi"])
    return f"{max(whole, 1)}Gi"
