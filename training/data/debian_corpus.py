"""A larger English pretraining corpus from Debian's documentation packages (issue 44).

The shared corpus (../shared/data: the Linux kernel docs, the PostgreSQL manual, Git's manual
pages and the Python docs, about 57 MB of text) is ~15M tokens: the base preset's budget of 98M
tokens reads it six and a half times, and the models memorise it (training loss 1.47 nats
against 3.74 held out, docs/division_of_labor.md). This builds more of the same kind of text
from the same source: technical English from the documentation packages of Debian's ``main``
archive (DFSG-free licences, recorded per package), read the way the product reads a user's
documents (rag.documents: an HTML page's navigation left out, its code kept), one text file per
page::

    python -m training.data.debian_corpus          # -> $RAG_HOME/corpus-debian

``apt-get download`` fetches each package (a package registry, the one network this machine
has) into ``--work``; ``dpkg-deb -x`` unpacks it there; the pages :data:`SOURCES` names are
converted to plain text under ``--out/<package>/``, each package's ``copyright`` file beside
them as ``COPYRIGHT.debian``, and ``--out/MANIFEST.json`` records every package's version, the
sha256 of its ``.deb``, its licences (the copyright file's ``License:`` names), files and
characters. Pages of fewer than :data:`MIN_CHARS` characters and pages whose text another page
already gave (Sphinx copies, translations' English fallbacks) are left out. Pretraining reads
the folder like any other corpus (``--corpus artifacts/corpus-debian ../shared/data/corpus``).

Why hand-written: the work is choosing pages (English only, no indexes, no search pages, no
highlighted source listings) and recording provenance; the download, unpacking and HTML reading
are apt, dpkg and rag.documents.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rag.documents import DocumentError, Limits, load_document
from rag.storage.manifest import file_hash

MIN_CHARS = 200  # a page shorter than this is a stub (an autodoc redirect, an empty index)

# a corpus reads every page it selects: astropy's API pages ask search engines not to index
# them (robots noindex), which the product honours for a user's folder, not here
READ_ALL = Limits(skip_noindex=False)

# pages no reader reads: indexes, search, highlighted source listings, static assets
DEFAULT_EXCLUDE = (
    "**/genindex*.html",
    "**/search.html",
    "**/py-modindex.html",
    "**/np-modindex.html",
    "**/_modules/**",
    "**/_static/**",
    "**/_images/**",
    "**/_downloads/**",
)


@dataclass(frozen=True)
class Source:
    """One documentation package and the pages of it that are English prose."""

    package: str  # the Debian package (bookworm, main)
    include: tuple[str, ...]  # globs of the pages taken, relative to the unpacked package
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE  # globs of pages left out


def _html(root: str) -> tuple[str, ...]:
    return (f"{root}/**/*.html",)


# Rendered HTML rather than Sphinx's _sources: an API page's text (its docstrings, from
# autodoc) is only in the HTML; a _sources page is "autoclass:: X". Ordered by kind: manuals
# and guides first, then library references.
SOURCES: tuple[Source, ...] = (
    Source("debian-handbook", ("usr/share/doc/debian-handbook/html/en-US/*.html",)),
    Source("debian-reference-en", ("usr/share/debian-reference/*.en.html",)),
    Source("developers-reference", _html("usr/share/developers-reference")),
    Source("debian-policy", _html("usr/share/doc/debian-policy/policy.html")),
    Source("apache2-doc", _html("usr/share/doc/apache2-doc/manual/en")),
    Source("perl-doc", ("usr/share/perl/*/pod/*.pod",)),
    Source("vim-runtime", ("usr/share/vim/vim90/doc/*.txt",)),
    Source("sqlite3-doc", ("usr/share/doc/sqlite3/*.html",)),
    Source("r-doc-html", ("usr/share/doc/r-doc-html/manual/*.html",)),
    Source("octave-doc", _html("usr/share/doc/octave")),
    Source("gnuplot-doc", _html("usr/share/doc/gnuplot/htmldocs")),
    Source("libreoffice-help-en-us", _html("usr/share/libreoffice/help/en-US")),
    Source("postgis-doc", ("usr/share/doc/postgis-doc/postgis.html",)),
    Source("cmake-doc", _html("usr/share/doc/cmake-data/html")),
    Source("sphinx-doc", _html("usr/share/doc/sphinx-doc/html")),
    Source("python-django-doc", _html("usr/share/doc/python-django-doc/html")),
    Source("python-sqlalchemy-doc", _html("usr/share/doc/python-sqlalchemy-doc/html")),
    Source("python-flask-doc", _html("usr/share/doc/python-flask-doc/html")),
    Source("python-werkzeug-doc", _html("usr/share/doc/python-werkzeug-doc/html")),
    Source("python-jinja2-doc", _html("usr/share/doc/python-jinja2-doc/html")),
    Source("python-requests-doc", _html("usr/share/doc/python-requests-doc/html")),
    Source("python-setuptools-doc", _html("usr/share/doc/python-setuptools-doc/html")),
    Source("python-pytest-doc", _html("usr/share/doc/python-pytest-doc/html")),
    Source("python-celery-doc", _html("usr/share/doc/python-celery-doc/html")),
    Source("python-tornado-doc", _html("usr/share/doc/python-tornado-doc/html")),
    Source("python-aiohttp-doc", _html("usr/share/doc/python-aiohttp-doc/html")),
    Source("python-lxml-doc", _html("usr/share/doc/python-lxml-doc/html")),
    Source("python-babel-doc", _html("usr/share/doc/python-babel-doc/html")),
    Source("python-pint-doc", _html("usr/share/doc/python-pint-doc/html")),
    Source("python-xarray-doc", _html("usr/share/doc/python-xarray-doc/html")),
    Source("python-dask-doc", _html("usr/share/doc/python-dask-doc/html")),
    Source("python-sklearn-doc", _html("usr/share/doc/python-sklearn-doc/html")),
    Source("python-scipy-doc", _html("usr/share/doc/python-scipy-doc/html")),
    Source("python-pandas-doc", _html("usr/share/doc/python-pandas-doc/html")),
    Source("python-sympy-doc", _html("usr/share/doc/python-sympy-doc/html")),
    Source("python-astropy-doc", _html("usr/share/doc/python-astropy-doc/html")),
    Source("python-statsmodels-doc", _html("usr/share/doc/python-statsmodels-doc/html")),
)


@dataclass
class CorpusConfig:
    """What ``python -m training.data.debian_corpus`` builds."""

    # the corpus folder written, one folder per package (default: $RAG_HOME/corpus-debian, where
    # the division-of-labour experiment's base preset looks for it)
    out: str = ""
    work: str = ""  # where .deb files are downloaded and unpacked (default: a temp folder)
    # the packages to read (default: every one of SOURCES); a name SOURCES lacks is an error
    packages: list[str] = field(default_factory=list)
    max_mb: float = 0.0  # stop after this many MB of text (0 = no limit), in SOURCES order


DEFAULT_NAME = "corpus-debian"


def default_out() -> Path:
    """``$RAG_HOME/corpus-debian``."""
    from rag.storage.paths import rag_home

    return rag_home() / DEFAULT_NAME


def licences(copyright_text: str) -> list[str]:
    """The licence names a Debian copyright file declares (its ``License:`` lines, DEP-5),
    sorted; ``["see COPYRIGHT.debian"]`` for a file written in free form."""
    names = {m.strip() for m in re.findall(r"^License:[ \t]*(\S[^\n]*)$", copyright_text, re.M)}
    return sorted(names) or ["see COPYRIGHT.debian"]


def _glob_re(pattern: str) -> re.Pattern[str]:
    """A glob as a regex over a whole relative path: ``**/`` any folders (or none), ``*`` and
    ``?`` within one name (Path.full_match does this from Python 3.13)."""
    out = []
    for part in re.split(r"(\*\*/|\*\*|\*|\?)", pattern):
        out.append(
            {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(part, re.escape(part))
        )
    return re.compile("".join(out) + r"\Z")


def _matches(rel: str, globs: tuple[str, ...]) -> bool:
    return any(_glob_re(g).match(rel) for g in globs)


def select_pages(root: Path, source: Source) -> list[Path]:
    """The unpacked package's pages that ``source`` takes, sorted."""
    out = []
    for pattern in source.include:
        for path in root.glob(pattern):
            rel = path.relative_to(root).as_posix()
            if path.is_file() and not _matches(rel, source.exclude):
                out.append(path)
    return sorted(set(out))


def page_text(path: Path) -> str:
    """A page's text as rag.documents reads it: HTML without navigation, a POD or Vim help
    file as the text it is."""
    if path.name.endswith(".pod"):
        return path.read_bytes().decode("utf-8", errors="replace")
    return load_document(path, limits=READ_ALL).text


def fetch(package: str, work: Path) -> tuple[Path, Path]:
    """(the downloaded .deb, the folder it is unpacked in), reusing both when present."""
    debs = work / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    found = sorted(debs.glob(f"{package}_*.deb"))
    if not found:
        subprocess.run(
            ["apt-get", "download", package],
            cwd=debs,
            check=True,
            capture_output=True,
            text=True,
        )
        found = sorted(debs.glob(f"{package}_*.deb"))
    if not found:
        raise RuntimeError(f"apt-get download {package}: no .deb appeared in {debs}")
    deb = found[-1]
    root = work / "unpacked" / package
    if not root.is_dir():
        tmp = root.with_name(package + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp)], check=True)
        tmp.rename(root)
    return deb, root


def build_package(source: Source, work: Path, out: Path, seen: set[str]) -> dict:
    """Convert one package's pages into ``out/<package>/``; returns its manifest entry.
    ``seen``: the text hashes written so far (a page another page already gave is skipped)."""
    deb, root = fetch(source.package, work)
    dest = out / source.package
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    copyright_file = next(root.glob("usr/share/doc/*/copyright"), None)
    text = copyright_file.read_text(errors="replace") if copyright_file else ""
    (dest / "COPYRIGHT.debian").write_text(text, encoding="utf-8")
    files = chars = short = copies = failed = 0
    for page in select_pages(root, source):
        try:
            body = page_text(page).strip()
        except (DocumentError, OSError, UnicodeError):
            failed += 1
            continue
        if len(body) < MIN_CHARS:
            short += 1
            continue
        digest = hashlib.sha1(body.encode("utf-8")).hexdigest()
        if digest in seen:
            copies += 1
            continue
        seen.add(digest)
        rel = page.relative_to(root).as_posix().replace("/", "__")
        (dest / (re.sub(r"\.(html|pod|txt)$", "", rel) + ".txt")).write_text(
            body + "\n", encoding="utf-8"
        )
        files += 1
        chars += len(body)
    version = deb.name.split("_")[1]
    return {
        "package": source.package,
        "version": version.replace("%3a", ":"),
        "deb": deb.name,
        "deb_sha256": file_hash(deb),
        "licences": licences(text),
        "files": files,
        "chars": chars,
        "left_out": {"short": short, "copies": copies, "unreadable": failed},
    }


def build(cfg: CorpusConfig) -> dict:
    """Build the corpus folder and its MANIFEST.json; returns the manifest."""
    known = {s.package: s for s in SOURCES}
    if unknown := [p for p in cfg.packages if p not in known]:
        raise ValueError(f"--packages: unknown package(s) {unknown}; see SOURCES")
    sources = [known[p] for p in cfg.packages] if cfg.packages else list(SOURCES)
    out = Path(cfg.out) if cfg.out else default_out()
    out.mkdir(parents=True, exist_ok=True)
    work_ctx = tempfile.TemporaryDirectory() if not cfg.work else None
    work = Path(cfg.work or work_ctx.name)  # type: ignore[union-attr]
    entries: list[dict] = []
    seen: set[str] = set()
    total = 0
    t0 = time.time()
    try:
        for n, source in enumerate(sources, 1):
            entry = build_package(source, work, out, seen)
            entries.append(entry)
            total += entry["chars"]
            print(
                f"[{n}/{len(sources)}] {source.package} {entry['version']}: {entry['files']} "
                f"pages, {entry['chars'] / 1e6:.1f}M chars (total {total / 1e6:.1f}M, "
                f"{time.time() - t0:.0f}s)",
                file=sys.stderr,
                flush=True,
            )
            if cfg.max_mb and total >= cfg.max_mb * 1e6:
                break
    finally:
        if work_ctx is not None:
            work_ctx.cleanup()
    manifest = {
        "what": "English technical documentation from Debian bookworm's main archive, as text",
        "built_with": "python -m training.data.debian_corpus",
        "out": str(out),
        "chars": total,
        "files": sum(e["files"] for e in entries),
        "packages": entries,
    }
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def main(argv: list[str] | None = None) -> int:
    from rag.cli.flags import config_from_args, dataclass_parser

    parser = dataclass_parser(
        "python -m training.data.debian_corpus", __doc__.split("\n\n")[0], CorpusConfig
    )
    args = parser.parse_args(argv)
    try:
        manifest = build(config_from_args(CorpusConfig, args))
    except (ValueError, RuntimeError, subprocess.CalledProcessError) as e:
        print(f"training.data.debian_corpus: error: {e}", file=sys.stderr)
        return 2
    print(
        f"{manifest['files']} pages, {manifest['chars'] / 1e6:.1f}M characters -> {manifest['out']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
