"""Shared building blocks of the typed stack configuration."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict
from pydantic.alias_generators import to_camel

from components.naming import DNS_LABEL, DNS_SUBDOMAIN
from components.quantity import QuantityError, parse_quantity


class ConfigProblem(ValueError):
    """A rule violation pointing at a key below the model that raised it.

    `field` is the key path relative to the model (e.g. "rdma.hcas"), `value` what was given and
    `allowed` a sentence saying what is allowed. The formatter turns it into one line:
    `ml-dev-env:<model path>.<field>: got <value>; <allowed>`.
    """

    def __init__(self, field: str, value: Any, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}: got {value!r}; {allowed}")


class Model(BaseModel):
    """Frozen, strict-keyed, camelCase configuration object."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_default=True,
    )


def _stringify(value: Any) -> Any:
    if isinstance(value, bool):
        return value  # rejected later: a bool is never a quantity
    if isinstance(value, int | float):
        return str(value)
    return value


def _check_quantity(value: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str):
        raise ValueError(f"expected a Kubernetes quantity string such as '128Gi', got {value!r}")
    try:
        amount = parse_quantity(value)
    except QuantityError as exc:
        raise ValueError(str(exc)) from None
    if amount <= 0:
        raise ValueError(f"{value!r} must be greater than zero")
    return value


def _check_label(value: str) -> str:
    if not DNS_LABEL.match(value):
        raise ValueError(
            f"{value!r} is not a valid name: lower-case letters, digits and '-', "
            "starting and ending with a letter or digit, at most 63 characters"
        )
    return value


def _check_subdomain(value: str) -> str:
    if not DNS_SUBDOMAIN.match(value):
        raise ValueError(
            f"{value!r} is not a valid DNS name: lower-case letters, digits, '-' and '.', at most 253 characters"
        )
    return value


_IMAGE_REF = re.compile(
    r"^(?P<name>[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*)"
    r"(:(?P<tag>[\w][\w.-]{0,127}))?(@(?P<digest>sha256:[a-f0-9]{64}))?$"
)


def check_image_ref(value: str) -> str:
    """An image reference pinned by tag or digest, never `latest`."""
    match = _IMAGE_REF.match(value)
    if not match:
        raise ValueError(f"{value!r} is not an image reference like 'registry/repo:tag' or 'repo@sha256:…'")
    if not match["tag"] and not match["digest"]:
        raise ValueError(f"{value!r} is not pinned: add a tag or a digest (never rely on 'latest')")
    if match["tag"] == "latest" and not match["digest"]:
        raise ValueError(f"{value!r} uses the 'latest' tag: pin a version tag or a digest")
    return value


def _check_cidr(value: str) -> str:
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a CIDR network such as '10.0.103.0/24' ({exc})") from None
    return value


def _check_abs_path(value: str) -> str:
    if not value.startswith("/") or "//" in value or (value != value.rstrip("/") and value != "/"):
        raise ValueError(f"{value!r} must be an absolute path without a trailing '/', e.g. '/workspace'")
    return value


Quantity = Annotated[str, BeforeValidator(_stringify), AfterValidator(_check_quantity)]
DnsLabel = Annotated[str, AfterValidator(_check_label)]
DnsSubdomain = Annotated[str, AfterValidator(_check_subdomain)]
ImageRef = Annotated[str, AfterValidator(check_image_ref)]
Cidr = Annotated[str, AfterValidator(_check_cidr)]
AbsPath = Annotated[str, AfterValidator(_check_abs_path)]
EnvValue = Annotated[str, BeforeValidator(_stringify)]


def duplicates(items: list[str]) -> list[str]:
    seen: set[str] = set()
    dups: list[str] = []
    for item in items:
        if item in seen and item not in dups:
            dups.append(item)
        seen.add(item)
    return dups
