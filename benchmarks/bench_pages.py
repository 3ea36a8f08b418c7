"""Reading a lock's index pages as JSON, as PyPI's HTML and as a mirror's HTML, on the plain and the general path.

    python benchmarks/bench_pages.py [--lock lockfiles/glm5_2-ascend.lock.yaml] [--pages DIR] [--repeat 5]

Downloads, once into ``--pages`` (default: a directory under the system's temporary one), the Simple API
page of every package the lock takes from PyPI, in both of PyPI's forms (PEP 691 JSON; PEP 503 HTML, whose
links are absolute), and writes a third form from the JSON: the HTML page a mirror serves, its links relative
to the page (``../../packages/<aa>/<bb>/<rest of the sha256>/<file>#sha256=…``, as bandersnatch, Nexus and
Artifactory write them). Then times envbuild's parse of every page in each form, the median of ``--repeat``
runs, with the plain path (links of a plain shape taken without ``urljoin``) and with it switched off, and
checks that both paths read the same files. Not a test: it prints figures and never fails on them.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envbuild.index import pages  # noqa: E402
from envbuild.index.pages import ProjectPage, parse_html, parse_json  # noqa: E402
from envbuild.lock.io import read_lock  # noqa: E402

PYPI = "https://pypi.org/simple"
MIRROR = "https://mirror.internal:8081/repository/pypi/simple"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"


def download(names: list[str], into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    with requests.Session() as session:
        for i, name in enumerate(names):
            for suffix, accept in ((".json", JSON_TYPE), (".html", "text/html")):
                path = into / f"{name}{suffix}"
                if not path.exists():
                    answer = session.get(f"{PYPI}/{name}/", headers={"Accept": accept}, timeout=60)
                    answer.raise_for_status()
                    path.write_bytes(answer.content)
            if (i + 1) % 50 == 0 or i + 1 == len(names):
                print(f"  pages: {i + 1}/{len(names)}", file=sys.stderr)


def mirror_page(json_body: bytes) -> str:
    """The HTML page a mirror serves for the same files: each link relative to the page."""
    links = []
    for item in json.loads(json_body)["files"]:
        sha = item["hashes"].get("sha256", "")
        href = f"../../packages/{sha[:2]}/{sha[2:4]}/{sha[4:]}/{item['filename']}#sha256={sha}"
        links.append(f'<a href="{html.escape(href)}">{html.escape(item["filename"])}</a><br/>')
    return "<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n"


def timed(parses: list[Callable[[], ProjectPage]], repeat: int) -> tuple[float, list[ProjectPage]]:
    times, read = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        read = [parse() for parse in parses]
        times.append(time.perf_counter() - start)
    return statistics.median(times), read


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lock", type=Path, default=Path("lockfiles/glm5_2-ascend.lock.yaml"))
    parser.add_argument("--pages", type=Path, default=Path(tempfile.gettempdir()) / "envbuild-bench-pages")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    lock = read_lock(args.lock).lock
    names = sorted({p.name.lower() for p in lock.packages if lock.index_for(p).rstrip("/") == PYPI})
    download(names, args.pages)
    bodies = {name: (args.pages / f"{name}.json").read_bytes() for name in names}
    forms: dict[str, list[Callable[[], ProjectPage]]] = {"json": [], "pypi-html": [], "mirror-html": []}
    for name in names:
        body, page = bodies[name], (args.pages / f"{name}.html").read_text(encoding="utf-8")
        mirrored = mirror_page(body)
        forms["json"].append(lambda n=name, b=body: parse_json(PYPI, n, b, f"{PYPI}/{n}/"))
        forms["pypi-html"].append(lambda n=name, b=page: parse_html(PYPI, n, b, f"{PYPI}/{n}/"))
        forms["mirror-html"].append(lambda n=name, b=mirrored: parse_html(MIRROR, n, b, f"{MIRROR}/{n}/"))
    files = sum(len(parse().files) for parse in forms["json"])
    print(f"{len(names)} pages, {files} files, {sum(map(len, bodies.values())) / 1e6:.0f} MB of JSON", file=sys.stderr)
    for form, parses in forms.items():
        plain, read = timed(parses, args.repeat)
        plain_url, plain_page = pages._PLAIN_URL, pages.plain_page
        pages._PLAIN_URL = re.compile(r"(?!)")  # the JSON form's plain path off
        pages.plain_page = lambda base: None  # the HTML forms' plain path off
        try:
            general, read_generally = timed(parses, args.repeat)
        finally:
            pages._PLAIN_URL, pages.plain_page = plain_url, plain_page
        same = "same files" if read == read_generally else "FILES DIFFER"
        print(
            f"  {form:<12} plain {plain:6.2f} s ({plain / files * 1e6:5.1f} us a file)   general {general:6.2f} s "
            f"({general / files * 1e6:5.1f} us a file)   {plain / general:.2f}x   {same}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
