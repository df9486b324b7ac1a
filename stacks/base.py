"""Shared building blocks of the typed stack configuration."""

from __future__ import annotations

import inspect
import ipaddress
import re
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, model_validator
from pydantic.alias_generators import to_camel

from core.naming import DNS_LABEL, DNS_SUBDOMAIN
from core.quantity import QuantityError, parse_quantity, size_problem
from inpod import contract


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
        # The keys (aliases) of the model the rule that found it read: set by `Model._run_rules`.
        self.reads: frozenset[str] = frozenset()
        super().__init__(f"{field}: got {value!r}; {allowed}")

    def under(self, prefix: str) -> ConfigProblem:
        """The same problem seen from a parent model (`prefix` is the key path of this model in it)."""
        return ConfigProblem(f"{prefix}.{self.field}", self.value, self.allowed)


class ConfigProblems(ValueError):
    """Several `ConfigProblem`s found by one model's rules: the formatter prints one line each."""

    def __init__(self, problems: Iterable[ConfigProblem]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(str(p) for p in self.problems))


Rule = TypeVar("Rule", bound=Callable[..., Iterator[ConfigProblem]])


def rule(func: Rule) -> Rule:
    """Mark a model method as a cross-field rule: a generator yielding every `ConfigProblem` it finds.

    All rules of a model run after its fields validated, in definition order, and everything they
    yield is reported together (one line per problem) — a user fixes all mistakes in one round. A field
    mistake stops its model's rules (and those of the models above) in pydantic; the loader
    (`stacks.loader.validate_all`) validates again without the reported values to report those rules too.
    """
    func.__config_rule__ = True  # type: ignore[attr-defined]
    return func


class Model(BaseModel):
    """Frozen, strict-keyed, camelCase configuration object."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_default=True,
    )

    @model_validator(mode="after")
    def _run_rules(self) -> Model:
        problems = []
        for run in _rules_of(type(self)):
            reads = _Reads(self)
            for problem in run(reads):  # type: ignore[arg-type]
                problem.reads = frozenset(reads._keys)
                problems.append(problem)
        if problems:
            raise ConfigProblems(problems)
        return self


class _Reads:
    """Stands in for a model while one of its rules runs and records the keys the rule reads (properties
    and methods run against the stand-in, so what they read counts too). The loader uses it to tell a rule
    about the user's values from one about a default standing in for a value it already reported."""

    def __init__(self, model: Model) -> None:
        self._model = model
        self._keys: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        fields = type(self._model).model_fields
        if name in fields:
            self._keys.add(fields[name].alias or name)
            return getattr(self._model, name)
        attr = inspect.getattr_static(type(self._model), name, None)
        if isinstance(attr, property) and attr.fget is not None:
            return attr.fget(self)
        if inspect.isfunction(attr):
            return types.MethodType(attr, self)
        return getattr(self._model, name)


def _rules_of(cls: type[Model]) -> list[Callable[[Model], Iterator[ConfigProblem]]]:
    seen: dict[str, Callable[[Model], Iterator[ConfigProblem]]] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if getattr(value, "__config_rule__", False):
                seen[name] = value
    return list(seen.values())


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
        hint = _quantity_case_hint(value)
        raise ValueError(str(exc) + (f"; did you mean {hint!r}? (suffixes are case-sensitive)" if hint else "")) from None
    if amount <= 0:
        raise ValueError(f"{value!r} must be greater than zero")
    return value


_SUFFIXES = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E", "m")


def _quantity_case_hint(value: str) -> str | None:
    """'900gi' → '900Gi': the same quantity with a suffix in Kubernetes' spelling, when that parses."""
    m = re.match(r"^([0-9.]+)([A-Za-z]+)$", value.strip())
    if not m:
        return None
    for suffix in _SUFFIXES:
        if suffix.lower() == m.group(2).lower() and suffix != m.group(2):
            try:
                parse_quantity(m.group(1) + suffix)
            except QuantityError:
                continue
            return m.group(1) + suffix
    return None


def _check_size(value: str) -> str:
    problem = size_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _check_label(value: str) -> str:
    if not DNS_LABEL.match(value):
        raise ValueError(
            f"{value!r} is not a valid name: lower-case letters, digits and '-', "
            "starting and ending with a letter or digit, at most 63 characters"
        )
    return value


def _check_subdomain(value: str) -> str:
    if "://" in value or "/" in value:
        bare = value.split("://", 1)[-1].split("/", 1)[0]
        raise ValueError(f"{value!r} is a URL; give the DNS name alone, without scheme or path: did you mean {bare!r}?")
    if not DNS_SUBDOMAIN.match(value):
        raise ValueError(f"{value!r} is not a valid DNS name: lower-case letters, digits, '-' and '.', at most 253 characters")
    return value


# A registry host may be an IPv6 literal in brackets (distribution/reference, file regexp.go: `ipv6address`
# `\[(?:[a-fA-F0-9:]+)\]`, one of `host`'s forms, then an optional `:port`).
IPV6_HOST = r"\[[a-fA-F0-9:]+\](:[0-9]+)?"
_IMAGE_REF = re.compile(
    rf"^(?P<name>({IPV6_HOST}/[a-z0-9]+([._-][a-z0-9]+)*|[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?)(/[a-z0-9]+([._-][a-z0-9]+)*)*)"
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


# Label syntax as the API server checks a pod's nodeSelector (kubernetes pkg/apis/core/validation/validation.go
# ValidatePodSpec → unversionedvalidation.ValidateLabels; k8s.io/apimachinery pkg/util/validation/validation.go
# IsQualifiedName for keys, IsValidLabelValue for values): a pod with another selector is refused.
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def label_key_problem(key: str) -> str | None:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix)):
        return f"label key {key!r}: its prefix must be a DNS subdomain (lower-case letters, digits, '-', '.')"
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return (
            f"label key {key!r}: a name of at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter "
            "or digit, after an optional DNS-subdomain prefix and '/'"
        )
    return None


def label_value_problem(value: str) -> str | None:
    if value and (len(value) > 63 or not _LABEL_NAME.match(value)):
        return (
            f"label value {value!r}: at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit (no spaces)"
        )
    return None


def _check_labels(value: dict[str, str]) -> dict[str, str]:
    problems = [p for k, v in value.items() for p in (label_key_problem(k), label_value_problem(v)) if p]
    if problems:
        raise ValueError("; ".join(problems) + ": the API server refuses such a pod")
    return value


def _check_label_value(value: str) -> str:
    problem = label_value_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _check_cidr(value: str) -> str:
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a CIDR network such as '10.0.103.0/24' ({exc})") from None
    return value


def _check_abs_path(value: str) -> str:
    if not value.startswith("/") or "//" in value or (value != value.rstrip("/") and value != "/"):
        raise ValueError(f"{value!r} must be an absolute path without a trailing '/', e.g. '{contract.WORKSPACE_DEFAULT}'")
    return value


Quantity = Annotated[str, BeforeValidator(_stringify), AfterValidator(_check_quantity)]
"""Any Kubernetes quantity (CPU counts may be unit-less: '32', '500m')."""
Size = Annotated[str, BeforeValidator(_stringify), AfterValidator(_check_quantity), AfterValidator(_check_size)]
"""A memory / shm / storage size: a quantity with a unit, at least 1Mi ('128' is refused: did you mean '128Gi'?)."""
DnsLabel = Annotated[str, AfterValidator(_check_label)]
DnsSubdomain = Annotated[str, AfterValidator(_check_subdomain)]
ImageRef = Annotated[str, AfterValidator(check_image_ref)]
Cidr = Annotated[str, AfterValidator(_check_cidr)]
AbsPath = Annotated[str, AfterValidator(_check_abs_path)]
EnvValue = Annotated[str, BeforeValidator(_stringify)]
Labels = Annotated[dict[str, str], AfterValidator(_check_labels)]
"""A node selector: keys and values the API server accepts on a pod."""
LabelValue = Annotated[str, AfterValidator(_check_label_value)]


def duplicates(items: list[str]) -> list[str]:
    seen: set[str] = set()
    dups: list[str] = []
    for item in items:
        if item in seen and item not in dups:
            dups.append(item)
        seen.add(item)
    return dups
