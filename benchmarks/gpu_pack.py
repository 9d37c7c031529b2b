"""The GPU pack: what the lent GPU machine lacks for the packed GPU run, in one folder of ≤ 60 MiB.

    python -m benchmarks.gpu_pack                  # build gpu-pack/ (make gpu-pack)
    python -m benchmarks.gpu_pack --check          # verify it: size, sha256, the jobs' imports
    PACK=gpu-pack bash benchmarks/gpu_run.sh       # on the lent machine (docs/benchmarks.md)

Why: the lent machine (../shared/design/GPU.md) has no package registry and no network, and only
the checkout plus 64 MiB of named, git-ignored paths travel to it; ``../shared/data`` does not.
Its image has torch, transformers 5.17 and the other packages of :data:`IMAGE_PACKAGES`, but
not everything the GPU jobs import. So the pack carries, next to the checkout:

- ``wheels.tar.xz``: the py3.12 manylinux x86_64 wheels of :data:`WHEELS`, pinned here (the
  versions this project's ``.venv`` runs and is tested with), downloaded with ``pip download
  --no-deps --only-binary=:all:`` for Python 3.12 into ``$RAG_HOME/cache/gpu-pack-wheels``. Each
  names the job code that imports it. The image's transformers 5.17 cannot run two of the
  division-of-labour columns, so transformers 5.25 and what it needs beyond the image travel too
  (group ``transformers``). Each wheel is rewritten uncompressed (the same files, so the same
  RECORD hashes and the same install) and the lot compressed with xz: 17 MiB instead of 37, room
  the base preset's pretraining corpus needs;
- ``data/<part>.tar.xz``: exactly the files the packed division-of-labour job reads, as
  :func:`job_data` asks the job's own path resolution (``evals.division_of_labor.data
  .resolve_paths``, the base preset, no path given): SciFact, the SQuAD dev part, WikiText-2
  validation and the pretraining corpus. One archive per top-level folder, laid out as under
  ``../shared/data`` (a corpus from elsewhere, ``$RAG_HOME/corpus-debian``, under its own name),
  so the unpacked folder is the run's ``DATA``;
- ``MANIFEST.json``: every archive with its size and sha256, the folder its files came from,
  and every file in it as ``[path, bytes, sha256]`` (one compact row a line: ~30,000 files);
  a data archive's licence lines by path prefix (../shared/data/README.md), a wheel's registry
  sha256 and the job code that imports it.

Archives are deterministic (no times or owners), and a rebuild whose files did not change keeps
the archive it has. ``--check`` verifies a pack (the size limit, each archive and each file in it
with its sha256, no file the manifest does not list) and that every top-level module the packed
jobs import (computed in a subprocess from :data:`JOB_MODULES`, :func:`job_imports`) is in the
standard library, this repository, the image (:data:`IMAGE_MODULES`, :data:`OPTIONAL_MODULES`)
or a packed wheel. ``--unpack DIR`` (the packed run's first step on the machine) verifies the
pack, empties ``DIR/data`` and ``DIR/wheels``, extracts into them and checks every extracted
file's sha256. Checking and unpacking need only the standard library, so the same module runs on
the lent machine's bare ``python3``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rag.cli.flags import config_parser, run_config_cli
from rag.storage.manifest import file_hash as sha256

PROG = "benchmarks.gpu_pack"
REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20
MANIFEST = "MANIFEST.json"
WHEELS_ARCHIVE = "wheels.tar.xz"
XZ_PRESET = 9  # xz -9: text shrinks 5-6:1, uncompressed wheels about 8:1; ~4 min for a first build
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # every entry of a rewritten wheel: the same bytes each build

# ---------------------------------------------------------------------------- what travels

# pip download's target: the lent machine's interpreter and platform (GPU.md)
PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


@dataclass(frozen=True)
class Wheel:
    """One pinned wheel of the pack: the distribution, its version, the top-level modules it
    provides (what the import check credits it with) and which job code imports it."""

    dist: str
    version: str
    modules: tuple[str, ...]
    why: str
    group: str = "base"  # "transformers": the newer transformers the image lacks, and its needs


# The one place the pack's versions are pinned: those the project's .venv runs (pip show NAME).
# base: what the image lacks outright; transformers: transformers 5.25 and what it needs beyond
# the image, for two division-of-labour columns (see the group's first entry).
WHEELS: tuple[Wheel, ...] = (
    Wheel("faiss-cpu", "1.15.1", ("faiss",), "the retrieval column's vector index "
          "(indexes.faiss_index, the scratch index of rag.retrieval.retriever.CorpusRetriever)"),
    Wheel("bm25s", "0.3.16", ("bm25s",), "BM25 (rag.retrieval.bm25): the BM25 row, contrastive "
          "hard negatives, reader distractors"),
    Wheel("PyStemmer", "3.1.0", ("Stemmer",), "BM25's Snowball stemmer (rag.retrieval.bm25)"),
    Wheel("pytrec-eval-terrier", "0.5.11", ("pytrec_eval", "pytrec_eval_ext"),
          "nDCG@10 of the retrieval column (rag.evaluation.metrics)"),
    Wheel("datasets", "5.2.0", ("datasets",), "the trainers' Dataset (training.finetune"
          ".contrastive and .reader); sentence-transformers' trainer imports it too"),
    Wheel("dill", "0.4.1", ("dill",), "datasets (fingerprints) and multiprocess import it"),
    Wheel("multiprocess", "0.70.19", ("multiprocess", "_multiprocess"), "datasets imports it"),
    Wheel("xxhash", "4.1.0", ("xxhash",), "datasets imports it (datasets.fingerprint); GPU.md "
          "does not name it among the image's packages"),
    Wheel("transformers", "5.25.0", ("transformers",), "the division-of-labour qa column "
          "(rag.generate passes the KV cache as cache=, a 5.25 keyword; 5.17 rejects it) and the "
          "reading column's clm-causal cell (transformers 5.17's AutoModelForQuestionAnswering"
          ".register ignores a native config class, so training.finetune.decoder_qa's head is "
          "never built)", "transformers"),
    Wheel("huggingface_hub", "2.4.0", ("huggingface_hub",), "transformers 5.25 checks for "
          "huggingface_hub >= 2.4 at import (the image has 1.33)", "transformers"),
    Wheel("httpx2", "2.17.0", ("httpx2",), "huggingface_hub 2.4 imports it", "transformers"),
    Wheel("httpcore2", "2.17.0", ("httpcore2",), "httpx2 imports it", "transformers"),
    Wheel("truststore", "0.10.5", ("truststore",), "httpcore2 imports it", "transformers"),
    Wheel("kernels", "0.19.1", ("kernels",), "a requirement of transformers 5.25 (imported when "
          "present, as in the .venv the jobs are tested in)", "transformers"),
    Wheel("tomlkit", "0.14.0", ("tomlkit",), "a requirement of kernels 0.19", "transformers"),
)  # fmt: skip


# Licence lines of the data the job reads (../shared/data/README.md), by the longest matching
# prefix of a file's path in the unpacked DATA folder.
LICENCES = {
    "squad/": "CC BY-SA 4.0 (SQuAD v1.1)",
    "scifact/": "CC BY-NC 2.0 (SciFact, Wadden et al. 2020)",
    "wikitext-2/": "CC BY-SA 3.0 (WikiText-2)",
    "python-docs/": "PSF License 2 (see COPYRIGHT.debian)",
    "corpus/linux-doc/": "GPL-2 (Linux kernel documentation; see COPYRIGHT.debian)",
    "corpus/postgresql-doc/": "PostgreSQL Licence (PostgreSQL 15 manual; see COPYRIGHT.debian)",
    "corpus/git-doc/": "GPL-2 (Git manual pages; see COPYRIGHT.debian)",
    "corpus-debian/": "DFSG-free, per package: corpus-debian/MANIFEST.json and each package's "
    "COPYRIGHT.debian (training.data.debian_corpus)",
}
# what the packed division-of-labour job reads each top-level data folder for
WHY = {
    "squad": "the SQuAD dev retrieval set, contrastive pairs, the qa and reading columns",
    "scifact": "the SciFact dev retrieval set and contrastive pairs",
    "wikitext-2": "bits per byte (the generation column)",
    "python-docs": "the base preset's pretraining and tokenizer corpus",
    "corpus": "the base preset's pretraining and tokenizer corpus",
    "corpus-debian": "the base preset's pretraining and tokenizer corpus",
}
UNLISTED = "not recorded in benchmarks/gpu_pack.py LICENCES: see the folder's own notices"

# ---------------------------------------------------------------------------- the lent image

# The lent machine's image (shared/design/GPU.md, "What the image has"), as distributions.
IMAGE_PACKAGES = (
    "torch", "transformers", "sentence-transformers", "huggingface_hub", "peft", "accelerate",
    "tokenizers", "safetensors", "numpy", "scipy", "scikit-learn", "pandas", "pyarrow",
    "matplotlib", "jax", "cupy", "triton",
)  # fmt: skip
# ... as the top-level modules they and the dependencies they declare provide (the image's
# versions: transformers 5.17 -> huggingface_hub 1.33 -> httpx; torch -> sympy, jinja2, ...).
IMAGE_MODULES = frozenset({
    # the packages GPU.md names
    "torch", "functorch", "torchgen", "transformers", "sentence_transformers", "huggingface_hub",
    "peft", "accelerate", "tokenizers", "safetensors", "numpy", "scipy", "sklearn", "pandas",
    "pyarrow", "matplotlib", "mpl_toolkits", "pylab", "jax", "jaxlib", "cupy", "cupy_backends",
    "cupyx", "triton",
    # what they declare: torch
    "filelock", "fsspec", "jinja2", "markupsafe", "networkx", "sympy", "mpmath", "setuptools",
    "_distutils_hack", "pkg_resources", "typing_extensions",
    # transformers, huggingface_hub 1.33, accelerate, peft
    "packaging", "yaml", "_yaml", "regex", "tqdm", "typer", "click", "rich", "shellingham",
    "markdown_it", "mdurl", "pygments", "annotated_doc", "hf_xet", "httpx", "httpcore", "anyio",
    "idna", "h11", "certifi", "sniffio", "psutil",
    # scikit-learn, pandas, matplotlib, jax, cupy
    "joblib", "threadpoolctl", "narwhals", "cloudpickle", "dateutil", "six", "pytz", "tzdata",
    "contourpy", "cycler", "fontTools", "kiwisolver", "PIL", "pyparsing", "ml_dtypes",
    "opt_einsum", "fastrlock",
})  # fmt: skip
# Imported only where present (each behind ``try: import ... except ImportError`` in the
# library named), so a job does not need them: module -> who looks for it.
OPTIONAL_MODULES = {
    "brotli": "httpx2 (response decoding)",
    "charset_normalizer": "numpy.f2py",
    "google": "accelerate (looks for google.colab)",
    "orjson": "bm25s (JSON)",
    "zstandard": "fsspec (compression)",
}

# The repository modules whose code the packed jobs run: the job's entry, then each module they
# import inside a function (measured: ``python -X importtime -m evals.division_of_labor --preset
# tiny ...``, the repository imports at depth 0), plus indexes.faiss_index, which the index
# registry imports by name. The import check imports these and what their functions import.
JOB_MODULES: dict[str, tuple[str, ...]] = {
    "throughput": ("benchmarks.pretrain_throughput", "rag.models"),
    "dol": (
        "evals.division_of_labor.run", "evals.division_of_labor.experiment",
        "evals.division_of_labor.steps", "evals.division_of_labor.columns",
        "evals.division_of_labor.data", "evals.division_of_labor.report",
        "evals.division_of_labor.compare", "evals.division_of_labor.cells",
        "evals.division_of_labor.presets", "evals.lm", "evals.qa", "evals.retrieval",
        "rag.generate.generator", "rag.generate.gqa_attention", "rag.generate.torch_load",
        "rag.retrieval.encoder", "rag.retrieval.rerank", "rag.retrieval.retriever",
        "rag.retrieval.bm25", "rag.evaluation.metrics", "indexes.faiss_index",
        "training.tokenizer", "training.pretrain.train", "training.data.pairs",
        "training.finetune.contrastive", "training.finetune.reader",
        "training.finetune.decoder_qa", "training.finetune.lora",
    ),
}  # fmt: skip


class PackError(RuntimeError):
    """The pack cannot be built or does not verify (exit 1, one line: rag.cli)."""


# ---------------------------------------------------------------------------- config


@dataclass
class GpuPackConfig:
    """What to build, verify or unpack; every field is a ``--kebab-case`` flag."""

    out: str = "gpu-pack"  # the pack folder (git-ignored; carry it to the lent machine)
    data: str = ""  # the shared data folder the job's data is taken from
    max_mib: float = 60.0  # the pack's size limit in MiB (64 MiB travel, the checkout included)
    check: bool = False  # verify an existing pack (size, sha256, the jobs' imports), build nothing
    imports: bool = True  # --check: also check the jobs' imports (--no-imports: files only)
    wheels: bool = True  # pack the wheels (--no-wheels: a data-only pack, e.g. for a test)
    unpack: str = ""  # verify the pack, then extract it into this folder's data/ and wheels/


# ---------------------------------------------------------------------------- helpers


def folder_bytes(folder: Path) -> int:
    """Bytes of every file under ``folder``: what travels when it is carried."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def size_problem(folder: Path, max_mib: float) -> str | None:
    """The one-line error when ``folder`` is over ``max_mib`` MiB, else None."""
    n = folder_bytes(folder)
    if n <= max_mib * MIB:
        return None
    return (
        f"{folder} is {n / MIB:.1f} MiB ({n:,} bytes), over the {max_mib:g} MiB limit "
        f"(--max-mib; what travels to the lent machine is 64 MiB with the checkout)"
    )


def normalise(dist: str) -> str:
    """A distribution name as wheel file names spell it (PEP 427/503: ``PyStemmer`` ->
    ``pystemmer``, ``faiss-cpu`` -> ``faiss_cpu``)."""
    return re.sub(r"[-_.]+", "_", dist).lower()


def wheel_modules(path: Path) -> list[str]:
    """The top-level modules a wheel installs: its packages and modules, ``.dist-info``,
    ``.data`` and bundled-library folders (``faiss_cpu.libs``) left out."""
    names = set()
    with zipfile.ZipFile(path) as zf:
        for entry in zf.namelist():
            top = entry.split("/", 1)[0]
            if top.endswith((".dist-info", ".data", ".libs")):
                continue
            if "/" not in entry:  # a module file: name.py, name.cpython-312-x86_64-linux-gnu.so
                top = top.split(".", 1)[0]
            names.add(top)
    return sorted(names)


def licence_of(path: str, licences: dict[str, str] = LICENCES) -> str:
    """The licence line of a data file, by its path in the unpacked DATA folder: the line of
    the longest prefix of it in ``licences`` (an archive's manifest row has its own table)."""
    prefixes = [p for p in licences if path.startswith(p)]
    return licences[max(prefixes, key=len)] if prefixes else UNLISTED


def job_data(data: Path) -> list[Path]:
    """The files and folders the packed division-of-labour job reads when no path is given
    (``gpu_run.sh`` passes ``--scifact``, ``--squad`` and ``--wikitext`` at these same places in
    ``DATA``, and the corpus is the preset's default): what the job's own resolution
    (``evals.division_of_labor.data.resolve_paths``, base preset) returns with ``data`` as the
    shared data folder, so the pack follows the job when its default corpus changes. Its
    one-line error (a corpus not built yet) is the build's."""
    from evals.division_of_labor.data import resolve_paths
    from evals.division_of_labor.presets import ExperimentConfig

    cfg = resolve_paths(ExperimentConfig(preset="base", out="-"), data)
    return [Path(cfg.scifact), Path(cfg.squad), Path(cfg.wikitext), *map(Path, cfg.corpus)]


def data_parts(data: Path, paths: list[Path]) -> dict[str, tuple[Path, list[tuple[str, Path]]]]:
    """``paths`` as archive parts: top-level folder name -> (the folder the part's paths are
    relative to, [(path in DATA, source file)]). A folder gives every file under it (its
    documents and its licence notices), hidden ones left out; a path outside ``data`` goes
    under its own name (``$RAG_HOME/corpus-debian`` -> ``corpus-debian/``). A path that does
    not exist is an error naming it."""
    parts: dict[str, tuple[Path, dict[str, Path]]] = {}
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(f"--data {data}: {path} not found")
        path = path.resolve()
        base = data.resolve() if path.is_relative_to(data.resolve()) else path.parent
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for f in files:
            rel = f.relative_to(base)
            if any(part.startswith(".") for part in rel.parts):
                continue
            parts.setdefault(rel.parts[0], (base, {}))[1][rel.as_posix()] = f
    return {top: (base, sorted(files.items())) for top, (base, files) in sorted(parts.items())}


def write_archive(members: list[tuple[str, Path]], dest: Path) -> None:
    """A deterministic ``.tar.xz`` of ``members`` ((name in the archive, file)): no times or
    owners recorded, every mode 0644, so the same files give the same bytes."""
    tmp = dest.with_name(dest.name + ".tmp")
    with tarfile.open(tmp, "w:xz", preset=XZ_PRESET) as tar:
        for name, src in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = src.stat().st_size, 0, 0o644
            with src.open("rb") as fh:
                tar.addfile(info, fh)
    tmp.replace(dest)


def _reusable(old: dict[str, Any] | None, out: Path, files: list[list[Any]]) -> bool:
    """Whether the pack's existing archive ``old`` (a manifest row) holds exactly ``files``
    and is intact: then a rebuild keeps it (xz -9 of a corpus takes minutes)."""
    if not old or not (out / old["file"]).is_file():
        return False
    return old.get("files") == files and sha256(out / old["file"]) == old["sha256"]


def fetch_wheels(cache: Path, wheels: tuple[Wheel, ...] = WHEELS) -> list[tuple[Wheel, Path]]:
    """``pip download`` the pinned wheels for the lent machine into ``cache`` (a wheel already
    there is not fetched again). One command for all: with ``--platform`` given, pip still takes
    a pure-Python (``none-any``) wheel. Each pin must give exactly one wheel, holding the
    modules :data:`WHEELS` credits it with."""
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", PYTHON_VERSION, "--implementation", "cp"]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    cmd += ["-d", str(cache)] + [f"{w.dist}=={w.version}" for w in wheels]
    print(f"{PROG}: pip download of {len(wheels)} wheels into {cache}", file=sys.stderr)
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        last = [line for line in run.stderr.splitlines() if line.strip()][-1:] or ["(no output)"]
        raise PackError(f"pip download failed (exit {run.returncode}): {last[0]}")
    found = []
    for w in wheels:
        prefix = f"{normalise(w.dist)}-{w.version}-"
        hits = [p for p in sorted(cache.glob("*.whl")) if p.name.lower().startswith(prefix)]
        if len(hits) != 1:
            raise PackError(f"{w.dist}=={w.version}: {len(hits)} wheels in {cache}, want one")
        if missing := sorted(set(w.modules) - set(wheel_modules(hits[0]))):
            raise PackError(f"{hits[0].name} lacks the modules {missing} it is packed for")
        found.append((w, hits[0]))
    return found


def stored_wheel(src: Path, dest: Path) -> None:
    """``src`` rewritten with every entry uncompressed and dated 1980: the same files (so the
    same RECORD hashes and the same install), but xz can now compress across them (faiss-cpu's
    18 MiB wheel becomes 9 MiB in the archive, transformers' 13 MiB 3.7)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            entry = zipfile.ZipInfo(info.filename, ZIP_EPOCH)
            entry.external_attr = info.external_attr
            zout.writestr(entry, zin.read(info))


def _commit() -> str:
    run = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    )
    return run.stdout.strip() if run.returncode == 0 else "unknown"


# ---------------------------------------------------------------------------- build


def read_manifest(out: Path) -> dict[str, Any]:
    """The pack's manifest; a missing or unreadable one is an error naming the pack."""
    path = out / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"--out {out}: no {MANIFEST} (build the pack: make gpu-pack)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise PackError(f"{path}: not JSON ({e})") from e


def _archive(
    out: Path, name: str, members: list[tuple[str, Path]], old: dict | None
) -> dict[str, Any]:
    """Write (or keep) the archive ``name`` of ``members`` ((name in it, file)); its manifest
    row, ``files`` holding ``[path, bytes, sha256]`` for each."""
    files = [[rel, src.stat().st_size, sha256(src)] for rel, src in members]
    dest = out / name
    if _reusable(old, out, files):
        print(f"{PROG}: {name} unchanged ({len(files)} files), kept", file=sys.stderr)
    else:
        print(f"{PROG}: {name} ({len(files)} files) ...", file=sys.stderr)
        dest.parent.mkdir(parents=True, exist_ok=True)
        write_archive(members, dest)
    return {"file": name, "bytes": dest.stat().st_size, "sha256": sha256(dest), "files": files}


def manifest_text(manifest: dict[str, Any]) -> str:
    """The manifest as indented JSON, but each archive's ``files`` one compact row per line:
    the base corpus is ~30,000 files, and a row per line keeps that to about 5 MiB."""
    shallow = {**manifest, "archives": []}
    for i, archive in enumerate(manifest["archives"]):
        shallow["archives"].append({**archive, "files": f"@files{i}@"})
    text = json.dumps(shallow, indent=2)
    for i, archive in enumerate(manifest["archives"]):
        rows = ",\n".join(
            "        " + json.dumps(r, separators=(",", ":")) for r in archive["files"]
        )
        text = text.replace(f'"@files{i}@"', "[\n" + rows + "\n      ]" if rows else "[]")
    return text + "\n"


def build_pack(cfg: GpuPackConfig) -> dict[str, Any]:
    """Build ``cfg.out``: ``wheels.tar.xz`` (unless ``--no-wheels``), one data archive per
    top-level folder the job reads and ``MANIFEST.json``; fails (one line naming the size) when
    the pack is over ``--max-mib``. Every data file is found before anything is written.
    Returns the sizes (:func:`summary`)."""
    from rag.storage.paths import cache_dir, shared_data_dir

    data = Path(cfg.data) if cfg.data else shared_data_dir()
    if data is None or not data.is_dir():
        raise FileNotFoundError(f"--data {cfg.data or '../shared/data'}: no such folder")
    parts = data_parts(data, job_data(data))
    out = Path(cfg.out)
    try:
        previous = {a["file"]: a for a in read_manifest(out)["archives"]}
    except (OSError, KeyError, TypeError, PackError):
        previous = {}
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "wheels", ignore_errors=True)  # loose wheels: the layout before the archive
    archives = []
    if cfg.wheels:
        cache = cache_dir() / "gpu-pack-wheels"
        with tempfile.TemporaryDirectory(prefix="gpu-pack-wheels-") as tmp:
            members, wheels = [], []
            for w, path in fetch_wheels(cache):
                stored = Path(tmp) / path.name
                stored_wheel(path, stored)
                members.append((path.name, stored))
                wheels.append(
                    {"file": path.name, "dist": w.dist, "version": w.version, "group": w.group,
                     "modules": wheel_modules(path), "why": w.why,
                     "download_bytes": path.stat().st_size, "download_sha256": sha256(path)}
                )  # fmt: skip
            row = _archive(out, WHEELS_ARCHIVE, members, previous.get(WHEELS_ARCHIVE))
        archives.append(
            {"kind": "wheels", "into": "wheels", "source": str(cache), "wheels": wheels} | row
        )
    for top, (base, members) in parts.items():
        name = f"data/{top}.tar.xz"
        row = _archive(out, name, members, previous.get(name))
        used = {p: line for p, line in LICENCES.items() if any(r.startswith(p) for r, _ in members)}
        if any(licence_of(r) == UNLISTED for r, _ in members):
            used[""] = UNLISTED
        why = WHY.get(top, "read by the base preset (evals.division_of_labor.data)")
        archives.append(
            {"kind": "data", "into": "data", "part": top, "why": f"dol: {why}",
             "source": str(base), "licences": used} | row
        )  # fmt: skip
    known = {a["file"] for a in archives}
    for stale in [*out.glob("*.tar.xz"), *out.glob("data/*.tar.xz")]:
        if stale.relative_to(out).as_posix() not in known:
            stale.unlink()
    manifest = {
        "format": 2,
        "layout": "archives[].files: [path, bytes, sha256], path relative to the folder the "
        "archive unpacks into (into) and to its source folder (source); a data file's licence "
        "is the line of the longest prefix of its path in the archive's licences",
        "built": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _commit(),
        "python": PYTHON_VERSION,
        "platforms": list(PLATFORMS),
        "max_mib": cfg.max_mib,
        "data_source": str(data.resolve()),
        "archives": archives,
    }
    (out / MANIFEST).write_text(manifest_text(manifest))
    if problem := size_problem(out, cfg.max_mib):
        raise PackError(problem)
    return summary(out, manifest)


def wheel_rows(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The manifest's wheels (those of its wheels archive)."""
    return [w for a in manifest["archives"] if a["kind"] == "wheels" for w in a["wheels"]]


def summary(out: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """The pack's sizes per part (the command's result). A wheel's size is its download's;
    the archive holds them together, compressed."""
    archives = manifest["archives"]
    return {
        "pack": str(out),
        "bytes": folder_bytes(out),
        "max_mib": manifest["max_mib"],
        "manifest_bytes": (out / MANIFEST).stat().st_size,
        "archives": {
            a["file"]: {
                "bytes": a["bytes"],
                "files": len(a["files"]),
                "source_bytes": sum(
                    [w["download_bytes"] for w in a["wheels"]]
                    if a["kind"] == "wheels"
                    else [f[1] for f in a["files"]]
                ),
            }
            for a in archives
        },
        "wheels": {
            f"{w['dist']}=={w['version']}": {"group": w["group"], "bytes": w["download_bytes"]}
            for w in wheel_rows(manifest)
        },
    }


def report(result: dict[str, Any]) -> str:
    """The human form: one row per archive (and per wheel), sizes in MiB."""

    def mib(n: int) -> str:
        return f"{n / MIB:.2f}"

    lines = [f"{result['pack']}: {mib(result['bytes'])} MiB of {result['max_mib']:g} MiB", ""]
    lines += ["| part | MiB | what |", "|---|---|---|"]
    for name, a in result["archives"].items():
        lines.append(
            f"| {name} | {mib(a['bytes'])} | {a['files']} files, "
            f"{mib(a['source_bytes'])} MiB {'as wheels' if name == WHEELS_ARCHIVE else 'of text'} |"
        )
    lines.append(f"| {MANIFEST} | {mib(result['manifest_bytes'])} | |")
    for name, w in result["wheels"].items():
        lines.append(f"| · {name} | | {w['group']}: {mib(w['bytes'])} MiB as a wheel |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- check


def file_problems(
    out: Path, manifest: dict[str, Any], max_mib: float, deep: bool = True
) -> list[str]:
    """What is wrong with the pack's files: over the size limit, an archive missing or with
    another sha256, a file in an archive not as the manifest has it (``deep``: each archive
    read through), a file the manifest does not list."""
    problems = [p] if (p := size_problem(out, max_mib)) else []
    listed = {MANIFEST}
    for archive in manifest.get("archives", []):
        listed.add(archive["file"])
        path = out / archive["file"]
        if not path.is_file():
            problems.append(f"{archive['file']}: missing")
        elif (digest := sha256(path)) != archive["sha256"]:
            problems.append(
                f"{archive['file']}: sha256 {digest[:12]}…, manifest {archive['sha256'][:12]}…"
            )
        elif deep:
            problems += member_problems(path, archive)
    for path in sorted(out.rglob("*")):
        if path.is_file() and path.relative_to(out).as_posix() not in listed:
            problems.append(f"{path.relative_to(out).as_posix()}: not in {MANIFEST}")
    return problems


def member_problems(path: Path, archive: dict[str, Any]) -> list[str]:
    """Each file in the archive against the manifest's row for it (path, size, sha256)."""
    want = {f[0]: {"path": f[0], "bytes": f[1], "sha256": f[2]} for f in archive["files"]}
    seen, problems = set(), []
    with tarfile.open(path, "r:xz") as tar:
        for info in tar:
            row = want.get(info.name)
            fh = tar.extractfile(info) if info.isfile() else None
            if row is None or fh is None:
                problems.append(f"{archive['file']}: {info.name} not in {MANIFEST}")
                continue
            h = hashlib.sha256()
            while block := fh.read(MIB):
                h.update(block)
            if h.hexdigest() != row["sha256"]:
                problems.append(f"{archive['file']}: {info.name}: sha256 differs from {MANIFEST}")
            seen.add(info.name)
    problems += [f"{archive['file']}: {m} missing" for m in sorted(set(want) - seen)]
    return problems


_TRACE = r"""
import ast, importlib, json, sys, sysconfig
from pathlib import Path

mods, failed, lazy = json.loads(sys.argv[1]), {}, set()
for name in mods:
    try:
        importlib.import_module(name)
    except Exception as e:
        failed[name] = f"{type(e).__name__}: {e}"
for name in mods:
    path = getattr(sys.modules.get(name), "__file__", None)
    if not path:
        continue
    for fn in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"))):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    lazy.update(a.name for a in node.names)
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    lazy.add(node.module)
for name in sorted(lazy):
    try:
        importlib.import_module(name)
    except Exception as e:
        failed[name] = f"{type(e).__name__}: {e}"
# each top-level module: where it lives (the sys.path entry holding its file: the standard
# library, the repository, site-packages ...) and the name it is installed under there
# (scipy's _csparsetools registers a top-level name but is installed under scipy/)
paths = sysconfig.get_paths()
stdlib = {str(Path(paths[k]).resolve()) for k in ("stdlib", "platstdlib")}
entries = sorted({str(Path(p or ".").resolve()) for p in sys.path}, key=len, reverse=True)
tops = {}
for name, mod in list(sys.modules.items()):
    if mod is None or "." in name:
        continue
    file = getattr(mod, "__file__", None)
    if file is None:
        tops[name] = {"where": "package" if hasattr(mod, "__path__") else "built-in", "home": name}
        continue
    file = str(Path(file).resolve())
    entry = next((e for e in entries if file.startswith(e + "/")), "")
    home = file[len(entry) + 1 :].split("/", 1)[0].split(".", 1)[0] if entry else name
    where = "stdlib" if entry in stdlib or entry.endswith("lib-dynload") else entry
    tops[name] = {"where": where, "home": home, "file": file}
print(json.dumps({"modules": tops, "failed": failed}))
"""


def job_imports(jobs: tuple[str, ...] = tuple(JOB_MODULES)) -> dict[str, Any]:
    """Import the ``jobs``' modules (:data:`JOB_MODULES`) and every module their functions
    import in a fresh interpreter (this one's, with the repository on the path), and return
    ``{"modules": {top-level name: {"where", "home", "file"}}, "failed": {module: error}}``:
    the top-level modules a packed run needs, each with the ``sys.path`` entry it was found
    in (``stdlib``, ``built-in``, ``package`` for a namespace package) and the name it is
    installed under there."""
    mods = [m for job in jobs for m in JOB_MODULES[job]]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    run = subprocess.run(
        [sys.executable, "-c", _TRACE, json.dumps(mods)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if run.returncode != 0:
        last = [line for line in run.stderr.splitlines() if line.strip()][-1:] or ["(no output)"]
        raise PackError(f"importing the GPU jobs' modules failed: {last[0]}")
    return json.loads(run.stdout.splitlines()[-1])


def import_problems(traced: dict[str, Any], packed: set[str]) -> list[str]:
    """The top-level modules of ``traced`` (:func:`job_imports`) that neither the standard
    library, this repository, the image (:data:`IMAGE_MODULES`, :data:`OPTIONAL_MODULES`) nor
    the pack (``packed``: its wheels' modules) provide, and the job modules that failed to
    import. A module is judged
    by the name it is installed under (scipy's ``_csparsetools`` by ``scipy``)."""
    problems = [f"{m} does not import: {e}" for m, e in sorted(traced["failed"].items())]
    stdlib = set(sys.stdlib_module_names)
    repo = str(REPO.resolve())
    for name, info in sorted(traced["modules"].items()):
        names = {name, info["home"], info["home"].lstrip("_")}
        if name.startswith("__") or info["where"] in ("stdlib", "built-in") or names & stdlib:
            continue  # __main__ and editable-install finders; the standard library
        if info["where"] == repo or (info["where"] == "package" and (REPO / name).is_dir()):
            continue  # this repository
        if names & (IMAGE_MODULES | set(OPTIONAL_MODULES) | packed):
            continue
        problems.append(
            f"{name} ({info.get('file', info['where'])}): imported by the GPU jobs, "
            "neither on the image nor in the pack"
        )
    return problems


def check_pack(cfg: GpuPackConfig) -> dict[str, Any]:
    """``--check``: the pack's files (:func:`file_problems`) and, unless ``--no-imports``, the
    jobs' imports against the image and the pack's wheels; every problem in one line."""
    out = Path(cfg.out)
    manifest = read_manifest(out)
    problems = file_problems(out, manifest, cfg.max_mib)
    if cfg.imports:
        packed = {m for w in wheel_rows(manifest) for m in w["modules"]}
        problems += import_problems(job_imports(), packed)
    if problems:
        raise PackError(f"{out}: {len(problems)} problem(s): " + "; ".join(problems))
    return summary(out, manifest)


def unpack(cfg: GpuPackConfig) -> dict[str, Any]:
    """``--unpack DIR``: verify the pack, empty ``DIR/data`` and ``DIR/wheels``, extract each
    archive into its folder (the packed run's ``DATA``; the wheels pip installs) and check
    every extracted file against the manifest."""
    out, dest = Path(cfg.out), Path(cfg.unpack)
    manifest = read_manifest(out)
    # not deep: each extracted file is checked below, so the archives are read once
    if problems := file_problems(out, manifest, cfg.max_mib, deep=False):
        raise PackError(f"{out}: {len(problems)} problem(s): " + "; ".join(problems))
    for folder in {a["into"] for a in manifest["archives"]} | {"data", "wheels"}:
        shutil.rmtree(dest / folder, ignore_errors=True)
        (dest / folder).mkdir(parents=True)
    for archive in manifest["archives"]:
        into = dest / archive["into"]
        with tarfile.open(out / archive["file"], "r:xz") as tar:
            tar.extractall(into, filter="data")
        for rel, _, digest in archive["files"]:
            if sha256(into / rel) != digest:
                raise PackError(f"{into / rel}: sha256 differs from {MANIFEST}")
    print(f"{PROG}: unpacked {len(manifest['archives'])} archives into {dest}", file=sys.stderr)
    return summary(out, manifest)


def run(cfg: GpuPackConfig) -> dict[str, Any]:
    """The command: ``--unpack``, ``--check`` or a build."""
    if cfg.max_mib <= 0:
        raise ValueError(f"--max-mib must be > 0, not {cfg.max_mib:g}")
    if cfg.unpack:
        return unpack(cfg)
    return check_pack(cfg) if cfg.check else build_pack(cfg)


def main(argv: list[str] | None = None) -> int:
    """Exit 0 done, 2 a bad flag or path, 1 a pack over the limit or one that does not verify."""
    parser = config_parser(
        f"python -m {PROG}", __doc__, GpuPackConfig, shown={"data": "../shared/data"}
    )
    return run_config_cli(parser, GpuPackConfig, run, argv, report=report)


if __name__ == "__main__":
    raise SystemExit(main())
