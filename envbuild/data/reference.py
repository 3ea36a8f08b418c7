"""Docker's image reference grammar, written once: what the engine and a registry accept as a name.

The specification is distribution/reference (``reference.go`` and ``regexp.go``)::

    reference        := name [ ":" tag ] [ "@" digest ]
    name             := [domain "/"] path-component ["/" path-component]*
    domain           := host [":" port-number]
    host             := domain-name
    domain-name      := domain-component ["." domain-component]*
    domain-component := /([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])/
    path-component   := alpha-numeric [separator alpha-numeric]*
    alpha-numeric    := /[a-z0-9]+/
    separator        := /[_.]|__|[-]+/
    tag              := /[\\w][\\w.-]{0,127}/
    digest           := algorithm ":" hex (at least 32 hex digits)

and a name is at most 255 characters. Docker also refuses a bare 64-hex name (it reads as an image ID).
This is the grammar of docker 20.10's distribution/reference (v2.7), the oldest engine envbuild builds
on: the newer one also takes an ``[IPv6]`` host and reads an uppercase first component as a registry
(``Foo/bar``), which docker 20.10 refuses at tagging ("repository name must be lowercase"), so neither
is taken here.
The patterns here are Python ``re`` syntax that is also valid ECMA-262 (the JSON schema uses them):
``\\w`` is spelled ``[A-Za-z0-9_]`` because Python's ``\\w`` would also match non-ASCII letters.

Where these names come from: a lock's ``name`` becomes the path component of ``envbuild/<name>:<sha12>``
and ``envbuild-raw/<name>:<sha12>``; ``base_image.name`` and every ``--tag`` are whole references.
Checking them up front means a build never runs to the end only to fail at tagging.
"""

from __future__ import annotations

import re

NAME_TOTAL_MAX = 255

ALPHANUMERIC = r"[a-z0-9]+"
SEPARATOR = r"(?:[._]|__|-+)"
PATH_COMPONENT = rf"{ALPHANUMERIC}(?:{SEPARATOR}{ALPHANUMERIC})*"
DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
DOMAIN = rf"{DOMAIN_COMPONENT}(?:\.{DOMAIN_COMPONENT})*(?::[0-9]+)?"
NAME = rf"(?:{DOMAIN}/)?{PATH_COMPONENT}(?:/{PATH_COMPONENT})*"
TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
SHA256_DIGEST = r"sha256:[0-9a-f]{64}"  # the only digest a lock pins: lowercase, like the registry serves it
NAME_AND_TAG = rf"{NAME}(?::{TAG})?"

_IDENTIFIER = re.compile(r"[a-f0-9]{64}")
# Longer than any valid name with a tag: checked before any pattern, so no regex sees a huge string.
_MAX_CHECKED = NAME_TOTAL_MAX + 1 + 128

_COMPONENT_RULE = "lowercase letters and digits, separated by one '.', one or two '_', or '-'s"
_CREDENTIALS = "registry credentials belong in the docker config (`docker login`), never in an image name"


def split_reference(reference: str) -> tuple[str, str | None, str | None]:
    """``name[:tag][@digest]`` → (name, tag, digest), as the grammar reads it: the digest first (after
    the '@'), then the tag after the last ':' of the rest, unless a '/' follows that ':' (then it is a
    registry's port: ``host:5000/path`` has no tag)."""
    rest, at, digest = reference.partition("@")
    name, sep, tag = rest.rpartition(":")
    if not sep or "/" in tag:
        return rest, None, digest if at else None
    return name, tag, digest if at else None


def by_digest(reference: str) -> bool:
    """Whether ``reference`` is ``repository@sha256:<64 lowercase hex>`` with no tag: an image every node
    of a scheduled job pulls as the same bits."""
    name, at, digest = reference.partition("@")
    return (
        bool(at)
        and bool(re.fullmatch(SHA256_DIGEST, digest))
        and split_reference(name)[1] is None
        and not check_name(name)
    )


def split_tag(reference: str) -> tuple[str, str]:
    """(name, tag) as docker tags, pushes and names an image: a digest is not part of either, and a
    reference without a tag means ``latest``, docker's default tag."""
    name, tag, _ = split_reference(reference)
    return name, "latest" if tag is None else tag


def check_name_and_tag(reference: str) -> str | None:
    """Why ``[registry[:port]/]path[:tag]`` (no digest) is not a reference docker accepts, or None.

    The message quotes the offending part, except before an '@' (a digest, or pasted credentials)."""
    if not reference:
        return "'' is empty: expected [registry[:port]/]path[:tag]"
    if "@" in reference:
        return f"{_quote_at(reference)} contains '@': no digest here, and {_CREDENTIALS}"
    if len(reference) > _MAX_CHECKED:
        return f"{reference[:40]!r}… is {len(reference)} characters long; docker allows a {NAME_TOTAL_MAX}-character name and a 128-character tag"
    if any(c.isspace() or not c.isprintable() for c in reference):
        return f"{reference!r} contains whitespace or control characters"
    name, tag, _ = split_reference(reference)
    if tag is not None and not re.fullmatch(TAG, tag):
        return f"{reference!r}: tag {tag!r} must be 1 to 128 of letters, digits, '_', '.', '-', not starting with '.' or '-'"
    if problem := check_name(name):
        return f"{reference!r}: {problem}"
    return None


def check_name(name: str) -> str | None:
    """Why a repository name ``[registry[:port]/]path`` is not one docker accepts, or None."""
    if len(name) > NAME_TOTAL_MAX:
        return f"the name is {len(name)} characters long; docker allows at most {NAME_TOTAL_MAX}"
    if _IDENTIFIER.fullmatch(name):
        return "a name of 64 hex digits reads as an image ID"
    domain, path = split_domain(name)
    if re.fullmatch(NAME, name) and all(re.fullmatch(PATH_COMPONENT, c) for c in path.split("/")):
        return None  # (the pattern alone would take `Foo/bar`, whose `Foo` docker reads as a path component)
    if domain is not None and domain.startswith("["):
        return f"registry {domain!r}: docker 20.10 takes no [IPv6] address in an image name; give the host a name"
    if domain is not None and not re.fullmatch(DOMAIN, domain):
        return f"registry {domain!r} is not a host name with an optional numeric port"
    for component in path.split("/"):
        if not re.fullmatch(PATH_COMPONENT, component):
            upper = " (uppercase is not allowed)" if component.lower() != component else ""
            return f"path component {component!r} must be {_COMPONENT_RULE}{upper}"
    return "is not [registry[:port]/]path"  # not reached for any name the checks above pass


def split_domain(name: str) -> tuple[str | None, str]:
    """docker 20.10's own split: the first component is a registry when a '/' follows it and it has a '.' or
    a ':', or is ``localhost`` (a '[' too, so that an IPv6 host is named as the registry it is meant as)."""
    first, sep, rest = name.partition("/")
    if sep and (any(c in first for c in ".:[") or first == "localhost"):
        return first, rest
    return None, name


def _quote_at(reference: str) -> str:
    """The reference with everything before its last '@' hidden: that part may be a pasted password."""
    return repr("***@" + reference.rpartition("@")[2])
