"""The rules for URLs a user hands envbuild (a lock's ``repo`` and ``index``, mirror rules), and the one
redaction every message quoting such a URL goes through.

A URL's user part is where a secret hides: ``https://ghp_…@github.com/…`` is a GitHub token,
``https://user%3Atoken@…`` a password with its ':' encoded. Whatever is accepted here is written into
verify's JSON, build records, the image's own manifest and the cache, so the rule is strict:

- http(s), ``git://`` and ``file://`` URLs take no user part at all;
- ssh URLs (``ssh://git@host/…``, ``git@host:path``) may name a plain user, nothing else;
- no host, user or port begins with '-' (:func:`check_dashes`), in any scheme, '%'-encoded or not: ssh
  reads ``ssh://-oProxyCommand=…/x`` as an option that runs a command (CVE-2017-1000117), and only git's
  own check would stand in the way.

Credentials belong in a git credential helper or ``~/.netrc`` (git, package indexes) and in the docker
config (registries). A refused URL is quoted with its user part replaced by ``***``.
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, unquote, urlsplit

REPO_SCHEMES = ("https", "ssh", "git", "file")
INDEX_SCHEMES = ("https", "http", "file")
PLAIN_USER = r"[A-Za-z0-9._-]+"
# git's scp-like form, user@host:path, restricted to what a plain ssh user and host name look like.
_SCP_LIKE = re.compile(rf"{PLAIN_USER}@[A-Za-z0-9.-]+:(?!/?-)[A-Za-z0-9._~/-]+")
# Greedy up to the last '@' of the token: a password may hold an unencoded '/', which ends the URL's
# authority, so hiding only the authority's user part would still print the rest of the password.
_URL_WITH_AT = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)\S*@")

GIT_CREDENTIALS = "credentials belong in a git credential helper or ~/.netrc, not in the URL"
INDEX_CREDENTIALS = "index credentials belong in ~/.netrc (or a keyring), not in the URL"


def redact_url(url: str) -> str:
    """``url`` with everything up to its last '@' (after the scheme) replaced by ``***``: the user part of
    ``scheme://user:pass@host/…`` and of git's scp-like ``user@host:path``. A URL with no '@' comes back
    unchanged; one with an '@' in its path is over-hidden, which only costs a refusal message detail."""
    if "@" not in url:
        return url
    scheme, sep, _ = url.partition("://")
    prefix = scheme + sep if sep and "@" not in scheme else ""
    return prefix + "***" + url[url.rindex("@") :]


def as_url(repo: str) -> str:
    """A repository address as a URL: git's scp-like ``user@host:path`` as ``ssh://user@host/path`` (as pip's
    docs spell it: a path the scp-like form reads from the user's home is one such hosts serve from the
    root too), anything else as it is. For formats that take URLs only (PEP 751's ``vcs.url``)."""
    if _SCP_LIKE.fullmatch(repo):
        user_host, _, path = repo.partition(":")
        return f"ssh://{user_host}/{path.lstrip('/')}"
    return repo


def redact_password(url: str) -> str:
    """``url`` with its user part hidden (:func:`redact_url`) when that holds a password (``user:pass@``);
    a bare user (``ssh://root@node-001``) is no secret, and says which account a message is about."""
    rest = url.partition("://")[2] if "://" in url else url
    return redact_url(url) if ":" in rest.rpartition("@")[0] else url


def key_path(path: str, key: str) -> str:
    """A data file's field path with ``key`` appended, quoted like a value: a config's mirror key may be a
    URL with credentials."""
    return f"{path}.{redact_url(key)}" if path else redact_url(key)


def redact_urls(text: str) -> str:
    """Free text (a requirement, an error message) with the user part of every ``scheme://`` URL in it
    replaced by ``***``."""
    return _URL_WITH_AT.sub(lambda m: m.group(1) + "***@", text)


def userinfo(url: str) -> tuple[str, str] | None:
    """(scheme, user part) of a URL or scp-like address that has one, as git and curl read it (the user
    part ends at the authority's last '@'), else None. The scp-like form's scheme is ``ssh``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "ssh", url
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    return (scheme.lower(), authority.rpartition("@")[0]) if "@" in authority else None


def check_userinfo(url: str, where_credentials_go: str) -> str | None:
    """Refuse a user part that can carry a secret: any at all for http(s), git and file URLs; anything
    but a plain user name for ssh (no password, no '%'-encoding that could hide a ':')."""
    found = userinfo(url)
    if found is None:
        return None
    scheme, user = found
    if scheme == "ssh":
        if re.fullmatch(PLAIN_USER, user):
            return None
        return (
            f"{redact_url(url)!r} carries a password or an encoded character in its user part; an ssh URL may "
            "name a plain user only (git@host); ssh keys belong to ssh-agent or ~/.ssh/config"
        )
    return f"{redact_url(url)!r} carries credentials in its user part; {where_credentials_go}"


def _authority(url: str) -> str:
    """The ``[user[:password]@]host[:port]`` part of a URL, or of git's scp-like ``[user@]host:path`` (also
    ``[user@host:port]:path``); "" for a local path. Read as git reads it: a ':' before any '/' makes it ssh."""
    scheme, sep, rest = url.partition("://")
    if sep:
        return re.split(r"[/?#]", rest, maxsplit=1)[0]
    if url.startswith("[") and "]:" in url:
        return url[1 : url.index("]:")]
    colon, slash = url.find(":"), url.find("/")
    return url[:colon] if colon >= 0 and (slash < 0 or colon < slash) else ""


def check_dashes(url: str) -> str | None:
    """Refuse a URL whose host, user or port begins with '-': ssh, which git starts for ssh and scp-like
    URLs, reads ``-oProxyCommand=…`` there as an option and runs the command. git refuses such a host
    itself, but envbuild does not record or pass on what only git's check stops. '%'-escapes are decoded
    first, as git decodes a URL before it hands the host to ssh. No real host name begins with '-'
    (RFC 1123), so this costs nothing in any scheme."""
    parts = re.split(r"[@:\[\]]", unquote(_authority(url)))
    if any(part.startswith("-") for part in parts):
        return f"{redact_url(url)!r}: a host, user or port beginning with '-' is read as an option (ssh's -o…)"
    return None


def _split(url: str, where_credentials_go: str) -> SplitResult | str:
    """urlsplit, or why the URL cannot be split. The exception's own text is not used: it quotes the
    port, which may be the start of a password (``user:pass/word@host`` ends the host part at the '/')."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises on a port that is not a number in range
    except ValueError:
        if "@" in url:
            return f"{redact_url(url)!r} looks like it carries credentials (user:password@); {where_credentials_go}"
        return f"{url!r} is not a valid URL (its port or IPv6 address is malformed)"
    return parts


def check_repo_url(url: str) -> str | None:
    """Refuse anything git could treat as an option, a transport helper, a local path, or a URL that
    carries a secret."""
    shown = repr(redact_url(url))
    if url.startswith("-"):
        return f"{shown} starts with '-' and would be read as an option"
    if "::" in url.split("/", 1)[0] or url.startswith("ext:"):
        return f"{shown} names a git remote helper; only {', '.join(REPO_SCHEMES)} URLs are allowed"
    return _check_url(url, REPO_SCHEMES, f"scheme must be one of {', '.join(REPO_SCHEMES)}", GIT_CREDENTIALS, scp=True)


def check_index_url(url: str) -> str | None:
    """A PEP 691 index: http(s) or file, with a host, and no credentials."""
    return _check_url(url, INDEX_SCHEMES, "a package index must be an https, http or file URL", INDEX_CREDENTIALS)


def _check_url(
    url: str, schemes: tuple[str, ...], wrong_scheme: str, where_credentials_go: str, *, scp: bool = False
) -> str | None:
    """What a repository's and an index's URL must both be: printable, no part an option, one of
    ``schemes``, no secret in its user part, a host unless a file URL; ``scp``: git's scp-like form too."""
    shown = repr(redact_url(url))
    if any(c.isspace() or not c.isprintable() for c in url):
        return f"{shown} contains whitespace or control characters"
    if (problem := check_dashes(url)) is not None:
        return problem
    if scp and "://" not in url:
        # Not a URL: git reads it as scp-like (user@host:path) or a local path.
        if (problem := check_userinfo(url, where_credentials_go)) is not None:
            return problem
        if _SCP_LIKE.fullmatch(url):
            return None
    parts = _split(url, where_credentials_go)
    if isinstance(parts, str):
        return parts
    if parts.scheme not in schemes:
        return f"{shown}: {wrong_scheme}"
    if (problem := check_userinfo(url, where_credentials_go)) is not None:
        return problem
    if parts.scheme != "file" and not parts.hostname:
        return f"{shown} has no host"
    return None
