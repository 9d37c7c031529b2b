"""benchmarks/gpu_pack.py and the packed mode of benchmarks/gpu_run.sh: the GPU jobs' imports
are all on the lent machine's image or in the pack's wheels (computed in a subprocess), the size
limit fails with one line naming the size, ``--check`` catches a corrupted archive, and the
packed run's dry run on the CPU (a tiny pack from a subset of ../shared/data, no wheels) hands
back at most 8 files and no checkpoint. Nothing here needs the network or a GPU."""

from __future__ import annotations

import json
import os
import sys
import tarfile
from pathlib import Path

import pytest
from test_gpu_run import dry_run

from benchmarks import gpu_pack
from benchmarks.gpu_pack import (
    IMAGE_MODULES,
    JOB_MODULES,
    WHEELS,
    import_problems,
    job_imports,
    main,
)

REPO = Path(__file__).resolve().parents[1]
# what the image lacks and the jobs import: the import check must keep seeing them
KNOWN_LACKS = {"faiss", "bm25s", "Stemmer", "pytrec_eval", "datasets", "dill", "multiprocess"}


# the fake shared data: path in DATA -> text; plus a corpus built outside it ($RAG_HOME)
FAKE = {
    "scifact/corpus.jsonl": "{}",
    "scifact/queries.jsonl": "{}",
    "scifact/qrels/train.tsv": "q\td\t1",
    "squad/squad-v1.1-dev-part.json": "{}",
    "wikitext-2/wiki.valid.tokens": "= A =",
    "python-docs/page.rst.txt": "Python",
    "python-docs/COPYRIGHT.debian": "PSF",
}
OUTSIDE = {"corpus-debian/MANIFEST.json": "{}", "corpus-debian/pkg/page.txt": "Debian"}


def fake_data(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tiny shared data folder (:data:`FAKE`) and a corpus beside it (:data:`OUTSIDE`), and
    the job reading exactly those (``gpu_pack.job_data`` patched: the division-of-labour
    job's own default corpus is the builder's business, not this test's)."""
    data, home = root / "data", root / "home"
    for base, files in ((data, FAKE), (home, OUTSIDE)):
        for rel, text in files.items():
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            (base / rel).write_text(text)
    paths = [data / "scifact", data / "squad" / "squad-v1.1-dev-part.json"]
    paths += [
        data / "wikitext-2" / "wiki.valid.tokens",
        home / "corpus-debian",
        data / "python-docs",
    ]
    monkeypatch.setattr(gpu_pack, "job_data", lambda _data: paths)
    return data


def tiny_data(shared: Path, root: Path) -> Path:
    """A small copy of ../shared/data in its layout: six SQuAD articles (three dev) of three
    paragraphs, 80 SciFact claims with their abstracts and 200 more, 400 WikiText lines, three
    python-docs pages. The tiny division-of-labour preset runs on it."""
    from rag.evaluation.datasets import SQUAD_DEV_ARTICLES

    squad = json.loads((shared / "squad" / "squad-v1.1-dev-part.json").read_text())
    dev = [a for a in squad["data"] if a["title"] in SQUAD_DEV_ARTICLES][:3]
    train = [a for a in squad["data"] if a["title"] not in SQUAD_DEV_ARTICLES][:3]
    squad["data"] = [{**a, "paragraphs": a["paragraphs"][:3]} for a in dev + train]
    (root / "squad").mkdir(parents=True)
    (root / "squad" / "squad-v1.1-dev-part.json").write_text(json.dumps(squad))

    src, dst = shared / "scifact", root / "scifact"
    (dst / "qrels").mkdir(parents=True)
    qrels = (src / "qrels" / "train.tsv").read_text().splitlines()
    rows = [r.split("\t") for r in qrels[1:81]]
    docs = {r[1] for r in rows}
    queries = {r[0] for r in rows}
    (dst / "qrels" / "train.tsv").write_text("\n".join(qrels[:81]) + "\n")
    corpus = (src / "corpus.jsonl").read_text().splitlines()
    kept = [x for x in corpus if str(json.loads(x)["_id"]) in docs] + corpus[:200]
    (dst / "corpus.jsonl").write_text("\n".join(dict.fromkeys(kept)) + "\n")
    lines = (src / "queries.jsonl").read_text().splitlines()
    (dst / "queries.jsonl").write_text(
        "\n".join(x for x in lines if str(json.loads(x)["_id"]) in queries) + "\n"
    )

    (root / "wikitext-2").mkdir()
    wiki = (shared / "wikitext-2" / "wiki.valid.tokens").read_text().splitlines()[:400]
    (root / "wikitext-2" / "wiki.valid.tokens").write_text("\n".join(wiki) + "\n")

    (root / "python-docs").mkdir()
    for name in ("about.rst.txt", "bugs.rst.txt", "copyright.rst.txt", "COPYRIGHT.debian"):
        (root / "python-docs" / name).write_text((shared / "python-docs" / name).read_text())
    return root


def test_every_module_the_jobs_import_is_on_the_image_or_in_the_pack():
    """The modules of JOB_MODULES and what their functions import, imported in a subprocess:
    each top-level module is in the standard library, this repository, the image's list or a
    wheel of WHEELS."""
    traced = job_imports()
    assert not import_problems(traced, {m for w in WHEELS for m in w.modules})
    assert set(traced["modules"]) >= KNOWN_LACKS  # the list still reaches BM25, FAISS, datasets
    assert not KNOWN_LACKS & IMAGE_MODULES


def test_the_check_names_a_module_nobody_provides():
    traced = {"modules": {"faiss": {"where": "/site", "home": "faiss", "file": "/site/f.py"}}}
    traced["failed"] = {"evals.lm": "ImportError: no bm25s"}
    problems = import_problems(traced, packed=set())
    assert problems[0] == "evals.lm does not import: ImportError: no bm25s"
    assert "faiss (/site/f.py): imported by the GPU jobs, neither on the image" in problems[1]
    assert import_problems(traced | {"failed": {}}, {"faiss"}) == []


def test_job_modules_exist():
    for job, modules in JOB_MODULES.items():
        for name in modules:
            path = REPO / Path(*name.split("."))
            assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), job


PARTS = ["corpus-debian", "python-docs", "scifact", "squad", "wikitext-2"]


def test_a_pack_over_the_limit_fails_with_one_line_naming_its_size(tmp_path, monkeypatch, capsys):
    data = fake_data(tmp_path, monkeypatch)
    out = tmp_path / "pack"
    code = main(["--out", str(out), "--data", str(data), "--no-wheels", "--max-mib", "0.0001"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(err) == 1 + len(PARTS)  # a progress line per archive, then the error
    assert err[-1].startswith(f"benchmarks.gpu_pack: error: {out} is 0.0 MiB (")
    assert "bytes), over the 0.0001 MiB limit (--max-mib" in err[-1]
    # the same pack fits a sensible limit, and --check agrees
    assert main(["--out", str(out), "--data", str(data), "--no-wheels", "--json"]) == 0
    built = json.loads(capsys.readouterr().out)
    assert sorted(built["archives"]) == [f"data/{p}.tar.xz" for p in PARTS]
    assert built["wheels"] == {}
    assert main(["--out", str(out), "--check", "--no-imports", "--max-mib", "0.0001"]) == 1
    assert "over the 0.0001 MiB limit" in capsys.readouterr().err


def test_manifest_records_each_file_and_check_catches_corruption(tmp_path, monkeypatch, capsys):
    data = fake_data(tmp_path, monkeypatch)
    out = tmp_path / "pack"
    assert main(["--out", str(out), "--data", str(data), "--no-wheels"]) == 0
    manifest = json.loads((out / "MANIFEST.json").read_text())
    archives = {a["file"]: a for a in manifest["archives"]}
    rows = {f[0]: (a, f) for a in manifest["archives"] for f in a["files"]}
    assert sorted(rows) == sorted([*FAKE, *OUTSIDE])
    squad, (_, size, digest) = rows["squad/squad-v1.1-dev-part.json"]
    assert (
        Path(squad["source"]) / "squad/squad-v1.1-dev-part.json"
        == (data / "squad" / "squad-v1.1-dev-part.json").resolve()
    )
    assert size == 2 and len(digest) == 64
    assert gpu_pack.licence_of("squad/x.json", squad["licences"]).startswith("CC BY-SA 4.0")
    debian = archives["data/corpus-debian.tar.xz"]
    assert Path(debian["source"]) == (tmp_path / "home").resolve()  # outside the shared data
    licence = gpu_pack.licence_of("corpus-debian/pkg/page.txt", debian["licences"])
    assert licence.startswith("DFSG-free, per package")
    docs = archives["data/python-docs.tar.xz"]["licences"]
    assert docs == {"python-docs/": "PSF License 2 (see COPYRIGHT.debian)"}
    capsys.readouterr()
    assert main(["--out", str(out), "--check", "--no-imports"]) == 0

    archive = out / "data" / "squad.tar.xz"
    blob = bytearray(archive.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    archive.write_bytes(bytes(blob))
    (out / "data" / "stray.bin").write_bytes(b"x")
    capsys.readouterr()
    assert main(["--out", str(out), "--check", "--no-imports"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "2 problem(s): data/squad.tar.xz: sha256 " in err
    assert "data/stray.bin: not in MANIFEST.json" in err
    assert main(["--out", str(out), "--unpack", str(tmp_path / "x")]) == 1  # never unpacked
    assert not (tmp_path / "x").exists()


def test_a_rewritten_archive_that_still_matches_its_digest_is_caught(tmp_path, monkeypatch, capsys):
    """The manifest's per-file sha256s are checked inside each archive too: an archive
    rebuilt from other files (and its digest updated to match) still fails."""
    data = fake_data(tmp_path, monkeypatch)
    out = tmp_path / "pack"
    assert main(["--out", str(out), "--data", str(data), "--no-wheels"]) == 0
    (data / "wikitext-2" / "wiki.valid.tokens").write_text("= B =")
    dest = out / "data" / "wikitext-2.tar.xz"
    gpu_pack.write_archive(
        [("wikitext-2/wiki.valid.tokens", data / "wikitext-2" / "wiki.valid.tokens")], dest
    )
    manifest = json.loads((out / "MANIFEST.json").read_text())
    row = next(a for a in manifest["archives"] if a["file"] == "data/wikitext-2.tar.xz")
    row["sha256"], row["bytes"] = gpu_pack.sha256(dest), dest.stat().st_size
    (out / "MANIFEST.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main(["--out", str(out), "--check", "--no-imports"]) == 1
    assert "wiki.valid.tokens: sha256 differs from MANIFEST.json" in capsys.readouterr().err


def test_archives_are_deterministic_kept_when_unchanged_and_unpack_to_data(
    tmp_path, monkeypatch, capsys
):
    data = fake_data(tmp_path, monkeypatch)
    for name in ("a", "b"):
        assert main(["--out", str(tmp_path / name), "--data", str(data), "--no-wheels"]) == 0
    digests = [
        [a["sha256"] for a in json.loads((tmp_path / n / "MANIFEST.json").read_text())["archives"]]
        for n in ("a", "b")
    ]
    assert digests[0] == digests[1]
    capsys.readouterr()
    assert main(["--out", str(tmp_path / "a"), "--data", str(data), "--no-wheels"]) == 0
    assert "data/scifact.tar.xz unchanged (3 files), kept" in capsys.readouterr().err
    unpacked = tmp_path / "u"
    (unpacked / "data" / "old").mkdir(parents=True)  # emptied first
    assert main(["--out", str(tmp_path / "a"), "--unpack", str(unpacked)]) == 0
    found = sorted(
        p.relative_to(unpacked / "data").as_posix() for p in unpacked.rglob("*") if p.is_file()
    )
    assert found == sorted([*FAKE, *OUTSIDE])
    assert (unpacked / "data" / "python-docs" / "page.rst.txt").read_text() == "Python"
    assert (unpacked / "wheels").is_dir() and not list((unpacked / "wheels").iterdir())


def test_a_missing_data_file_is_a_usage_error(tmp_path, monkeypatch, capsys):
    data = fake_data(tmp_path, monkeypatch)
    out = tmp_path / "p"
    (data / "python-docs" / "page.rst.txt").unlink()
    (data / "python-docs" / "COPYRIGHT.debian").unlink()
    (data / "python-docs").rmdir()
    assert main(["--out", str(out), "--data", str(data), "--no-wheels"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"benchmarks.gpu_pack: error: --data {data}: {data / 'python-docs'} not found"
    # the job's own resolution refuses a missing file the same way (one line naming its flag)
    monkeypatch.undo()
    monkeypatch.setenv("RAG_HOME", str(tmp_path / "home"))
    (data / "wikitext-2" / "wiki.valid.tokens").unlink()
    assert main(["--out", str(out), "--data", str(data), "--no-wheels"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("benchmarks.gpu_pack: error: --")
    assert not out.exists()  # nothing is built before every file is found


def test_job_data_asks_the_jobs_own_resolution_about_the_given_folder(tmp_path, monkeypatch):
    """The real job_data: the division-of-labour job's resolution (base preset, no path given)
    run against ``--data``, not against the ambient ../shared/data; the Debian corpus found in
    $RAG_HOME comes along."""
    data = fake_data(tmp_path, monkeypatch)
    monkeypatch.undo()  # the real job_data (and the environment as it was)
    monkeypatch.setenv("RAG_HOME", str(tmp_path / "home"))
    (data / "corpus").mkdir()
    paths = gpu_pack.job_data(data)
    assert paths[:3] == [
        data / "scifact",
        data / "squad" / "squad-v1.1-dev-part.json",
        data / "wikitext-2" / "wiki.valid.tokens",
    ]
    assert data / "python-docs" in paths and tmp_path / "home" / "corpus-debian" in paths
    assert all(p.is_relative_to(data) or p.is_relative_to(tmp_path / "home") for p in paths)


def test_wheel_names_and_modules(tmp_path):
    assert gpu_pack.normalise("PyStemmer") == "pystemmer"
    assert gpu_pack.normalise("pytrec-eval-terrier") == "pytrec_eval_terrier"
    import zipfile

    whl = tmp_path / "faiss_cpu-1.0-cp312-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        for name in ("faiss/__init__.py", "faiss_cpu.libs/libx.so", "faiss_cpu-1.0.dist-info/RECORD",
                     "_ext.cpython-312-x86_64-linux-gnu.so", "one.py"):  # fmt: skip
            zf.writestr(name, "")
    assert gpu_pack.wheel_modules(whl) == ["_ext", "faiss", "one"]


def test_packed_dry_run_hands_back_at_most_8_files_and_no_checkpoint(
    shared_data, tmp_path, monkeypatch
):
    """PACK=... gpu_run.sh --dry-run: the pack verified and unpacked (the data the jobs read is
    its copy), two tiny jobs (~35 s on 2 cores; not marked slow: the only run of the packed
    mode in the default suite), at most 8 files handed back, no model among them."""
    data = tiny_data(shared_data, tmp_path / "data")
    paths = [data / "scifact", data / "squad" / "squad-v1.1-dev-part.json"]
    paths += [data / "wikitext-2" / "wiki.valid.tokens", data / "python-docs"]
    monkeypatch.setattr(gpu_pack, "job_data", lambda _data: paths)  # the tiny preset's
    pack = tmp_path / "pack"
    assert main(["--out", str(pack), "--data", str(data), "--no-wheels"]) == 0
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PACK": str(pack),
        "PY": sys.executable,
        "WORK": str(tmp_path / "work"),
        "RAG_HOME": str(tmp_path / "home"),
        "JOBS": "throughput dol",
        "BUDGET_S": "500",
    }
    env.pop("RAG_SHARED_DATA", None)
    dry_run(out, env)
    files = [p for p in out.rglob("*") if p.is_file()]
    assert 3 <= len(files) <= 8 and all(p.parent == out for p in files)
    names = {p.name for p in files}
    assert {"results.tar.xz", "summary.md", "dol-pretrain_loss.png"} <= names
    with tarfile.open(out / "results.tar.xz") as tar:
        members = tar.getnames()
    heavy = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
    assert not [m for m in members if m.endswith(heavy) or "checkpoint" in m]
    stage = next((tmp_path / "work").glob("results-*"))
    summary = json.loads((stage / "summary.json").read_text())
    jobs = {r["job"]: r for r in summary["jobs"]}
    assert sorted(jobs) == ["dol", "throughput"]
    assert all(r["status"] == "ok" for r in jobs.values()), jobs
    assert "pairs finished: clm/s0, mlm15/s0; complete (results.md)" in jobs["dol"]["result"]
    assert any(m.endswith("/dol/results.md") for m in members)
    hardware = (stage / "hardware.txt").read_text()
    assert "mode: dry-run, packed" in hardware and "with 0 wheels and 4 data archives" in hardware
    # the data came from the unpacked pack, not ../shared/data
    unpacked = tmp_path / "work" / "pack" / "data"
    assert (unpacked / "wikitext-2" / "wiki.valid.tokens").is_file()
    assert f"--wikitext {unpacked}/wikitext-2/wiki.valid.tokens" in (stage / "run.log").read_text()


def test_bad_flags_exit_2_in_one_line(tmp_path, capsys):
    assert main(["--max-mib", "0"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "benchmarks.gpu_pack: error: --max-mib must be > 0, not 0"
    )
    assert main(["--out", str(tmp_path), "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no MANIFEST.json (build the pack: make gpu-pack)" in err
