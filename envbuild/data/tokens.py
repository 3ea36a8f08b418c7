"""Bearer tokens as RFC 6750 allows them (``b64token``): what may be sent in an ``Authorization`` header.

A token from a server (a registry's token service) or from the user (a Ray token file) is checked before it
is sent: anything else cannot be encoded in a header (latin-1) or would split it into two.
"""

from __future__ import annotations

import re

BEARER_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


def bearer_problem(token: str) -> str | None:
    """Why ``token`` cannot be sent as a bearer token (None: it can). Never quotes it: a token is a secret."""
    if BEARER_TOKEN.fullmatch(token):
        return None
    return f"not an RFC 6750 bearer token ({len(token)} characters; letters, digits and -._~+/ then '=' only)"
