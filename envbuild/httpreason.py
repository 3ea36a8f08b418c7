"""Why an HTTP request got no answer, in a few plain words, for the index and the registry alike: a
reason such as "connection refused" instead of urllib3's nested repr, the user part of every URL it
quotes hidden."""

from __future__ import annotations

import re

import requests

from envbuild.data.urls import redact_url, redact_urls
from envbuild.errors import RemoteError
from envbuild.escape import for_terminal

TLS_UNTRUSTED = "TLS certificate verification failed"
_INCOMPLETE = re.compile(r"IncompleteRead\((\d+) bytes read, (\d+) more expected\)")
# urllib3's own word for what the proxy did ('Unable to connect to proxy', 'Tunnel connection failed: 502 …').
_PROXY_SAID = re.compile(r"ProxyError\('([^'\\]{1,200})'")
# What to do about it, where a proxy that intercepts TLS re-signs every answer (docs/configuration.md).
TLS_ADVICE = (
    "where a proxy intercepts TLS, give its CA certificate to envbuild's requests with REQUESTS_CA_BUNDLE=FILE "
    "and to git with GIT_SSL_CAINFO=FILE (or `git config --global http.sslCAInfo FILE`)"
)


def _show(text: str, limit: int = 200) -> str:
    text = redact_urls(text)
    return for_terminal(text[:limit]) + ("…" if len(text) > limit else "")


def reason(exc: BaseException) -> str:
    """A plain reason ("connection refused") instead of urllib3's nested repr; where the request went
    through a proxy that failed it, the proxy's fault, naming the proxy (:func:`_through_proxy`)."""
    if isinstance(exc, requests.exceptions.ProxyError):
        return _through_proxy(exc)
    return _plain(exc)


def _through_proxy(exc: requests.exceptions.ProxyError) -> str:
    """A proxy that did not answer or refused the tunnel is said as the proxy's fault: "connection refused"
    alone sends the user to a host that was never asked. The proxy is the one the environment names for the
    URL (envbuild sets none itself), shown without its user part (``http://user:pass@proxy:3128``)."""
    url = exc.request.url if exc.request is not None else None
    proxy = requests.utils.select_proxy(url, requests.utils.get_environ_proxies(url)) if url else None
    said = _plain(exc)
    if said.startswith(("HTTPConnectionPool(", "HTTPSConnectionPool(")) and (found := _PROXY_SAID.search(repr(exc))):
        said = found[1][:1].lower() + found[1][1:]
    named = f"the proxy {_show(redact_url(proxy))}" if proxy else "the proxy"
    return f"{named} failed the request ({said}); it comes from $HTTPS_PROXY/$HTTP_PROXY, and $NO_PROXY names hosts reached directly"


def _plain(exc: BaseException) -> str:
    text = repr(exc)
    for needle, said in (
        ("Connection refused", "connection refused"),
        ("NameResolutionError", "host name does not resolve"),
        ("Name or service not known", "host name does not resolve"),
        ("No route to host", "no route to host"),
        ("Network is unreachable", "network is unreachable"),
        ("CERTIFICATE_VERIFY_FAILED", TLS_UNTRUSTED),
        ("Connection reset", "connection reset by peer"),
    ):
        if needle in text:
            return said
    if cut := _INCOMPLETE.search(text):  # the server closed the connection inside its answer
        return f"the answer was cut short: {cut[1]} bytes read, {cut[2]} more expected"
    if isinstance(exc, requests.Timeout):
        return "timed out"
    # _show() hides the user part of every URL the text quotes (a redirect's target is the server's word)
    if isinstance(exc, requests.exceptions.InvalidSchema):  # requests follows redirects only to http(s)
        return f"redirected to a URL that is not http(s): {_show(str(exc).rsplit(' for ', 1)[-1])}"
    if isinstance(exc, RemoteError):
        return str(exc)
    return _show(str(exc).splitlines()[0]) if str(exc) else type(exc).__name__
