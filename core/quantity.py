"""Kubernetes resource quantities: parsing and comparison (pure functions, no Pulumi)."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}
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
        raise QuantityError(f"{value!r} is not a Kubernetes quantity (examples: '32', '500m', '128Gi', '1.5Ti')")
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


MIN_SIZE = _BINARY["Mi"]
"""Smallest memory / storage size accepted: anything below 1Mi is a missing or mistyped unit."""


def _exact_binary(amount: Decimal) -> str:
    """`amount` bytes written with the largest binary unit that keeps it a whole number (else in Mi, rounded up)."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi"):
        if amount >= _BINARY[suffix] and amount % _BINARY[suffix] == 0:
            return f"{int(amount / _BINARY[suffix])}{suffix}"
    return f"{math.ceil(amount / _BINARY['Mi'])}Mi"


def size_problem(value: str | int | float) -> str | None:
    """Why a valid quantity is no usable memory / shm / storage size, with its likely meaning (None if fine).

    A bare number is bytes to Kubernetes, so `memory: 128` asks for 128 bytes: refused with the
    likely meaning. So is anything below 1Mi (`128Ki`, or `128m`, which is 0.128 bytes, not 128Mi).

    >>> size_problem("128")
    "a size needs a unit (a bare number means bytes): did you mean '128Gi'?"
    >>> size_problem("128Gi") is None
    True
    """
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        return None  # not a quantity at all: parse_quantity reports it
    number, suffix = match["num"], match["suffix"] or ""
    amount = parse_quantity(text)
    if suffix == "":
        guess = f"{number}Gi" if amount < MIN_SIZE else _exact_binary(amount)
        return f"a size needs a unit (a bare number means bytes): did you mean '{guess}'?"
    if amount < MIN_SIZE:
        guess = f"{number}Mi" if suffix in ("m", "M") else f"{number}Gi"
        return f"at least 1Mi ({text} is {amount.normalize():f} bytes): did you mean '{guess}'?"
    return None
