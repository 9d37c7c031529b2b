"""Ingest throughput: our ingest (fp32 and int8) against the LangChain reference pipeline, in one
run, on the same files with the same sentence-transformers model; plus the int8 path's retrieval
quality on SciFact dev (nDCG@10 within 0.005 of fp32 is the bar).

``python -m benchmarks.ingest_throughput [--docs DIR] [--max-bytes N] [--encoder minilm]
[--precisions fp32,bf16,int8] [--encoder-backends torch,onnx] [--scifact DIR] [--scifact-docs N]
[--json]``

Our ingest runs once per (encoder backend, precision) pair; each row's ``pipeline`` names both
(``ours-onnx-int8``). The ONNX export is made and cached before timing (like the model load), so
the rows compare forward passes, not one-off exports.

Reference: ``RecursiveCharacterTextSplitter(1000, 200)`` + ``HuggingFaceEmbeddings`` (the same
model folder, batch 32, normalised) + ``FAISS.from_documents`` (langchain-community). Throughput
is source MB per second of wall time, model loading excluded for both (reported apart); our
overhead is the ingest's time outside the encoder's forward passes over the encode time.
Results go to ``$RAG_HOME/benchmarks/ingest_throughput/`` (results.json, run.json, plot).
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rag.cli.flags import config_parser, run_config_cli
from rag.models.precision import PRECISIONS
from rag.retrieval.encoder import ENCODER_BACKENDS
from rag.storage.paths import rag_home, shared_data_dir

PROG = "benchmarks.ingest_throughput"


@dataclass
class ThroughputConfig:
    """What to measure (defaults: a python-docs subset, minilm, both precisions)."""

    docs: str = ""  # folder of documents (default ../shared/data/python-docs/tutorial)
    max_bytes: int = 60_000  # use the first files (sorted) up to this many bytes
    encoder: str = "minilm"  # alias or folder, shared by every pipeline
    precisions: str = "fp32,int8"  # our ingest's encoder precisions to run (comma-separated)
    encoder_backends: str = (
        "torch"  # comma-separated: torch, onnx (rag.retrieval.encoder.ENCODER_BACKENDS)
    )
    scifact: str = ""  # BEIR SciFact folder for the int8 quality check (default: none = skip)
    scifact_docs: int = 400  # distractor documents added to the dev-judged ones (0 = full corpus)
    threads: int = 0  # torch threads (0 = torch's default)
    out: str = ""  # results folder (default $RAG_HOME/benchmarks/ingest_throughput)


def docs_folder(cfg: ThroughputConfig) -> Path | None:
    """``--docs``, or the python-docs tutorial of the shared data; None when neither is there."""
    if cfg.docs:
        return Path(cfg.docs)
    data = shared_data_dir()
    return data / "python-docs" / "tutorial" if data else None


def check(cfg: ThroughputConfig) -> None:
    """Refuse a run that cannot happen as given (exit 2, rag.cli), before loading any model."""
    for flag, value, allowed in (
        ("--precisions", cfg.precisions, PRECISIONS),
        ("--encoder-backends", cfg.encoder_backends, ENCODER_BACKENDS),
    ):
        if set(value.split(",")) - set(allowed):
            raise ValueError(
                f"{flag} takes a comma-separated subset of {','.join(allowed)}, not {value!r}"
            )
    for name, low in (("max_bytes", 1), ("scifact_docs", 0), ("threads", 0)):
        if getattr(cfg, name) < low:
            raise ValueError(
                f"--{name.replace('_', '-')} must be >= {low}, not {getattr(cfg, name)}"
            )
    docs = docs_folder(cfg)
    if docs is None or not docs.is_dir():
        raise ValueError(
            f"--docs {cfg.docs or '../shared/data/python-docs/tutorial'} is not a folder"
        )
    if cfg.scifact and not Path(cfg.scifact).is_dir():
        raise ValueError(f"--scifact {cfg.scifact} is not a folder")


def pick_files(folder: Path, max_bytes: int) -> list[Path]:
    from rag.documents import iter_files

    files, total = [], 0
    for f in iter_files([folder]):
        if isinstance(f, Exception):
            continue
        size = f.stat().st_size
        if files and total + size > max_bytes:
            break
        files.append(f)
        total += size
    return files


def run_reference(files: list[Path], model_path: Path) -> dict:
    """The LangChain pipeline the issue names, timed without its model load."""
    from langchain_community.embeddings import HuggingFaceEmbeddings
    from langchain_community.vectorstores import FAISS
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    t0 = time.perf_counter()
    emb = HuggingFaceEmbeddings(
        model_name=str(model_path),
        model_kwargs={"device": "cpu", "local_files_only": True},
        encode_kwargs={"normalize_embeddings": True, "batch_size": 32},
    )
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    splitter = RecursiveCharacterTextSplitter(chunk_size=1000, chunk_overlap=200)
    texts = [f.read_text(encoding="utf-8") for f in files]
    docs = splitter.create_documents(texts, metadatas=[{"source": str(f)} for f in files])
    t2 = time.perf_counter()
    FAISS.from_documents(docs, emb)
    t3 = time.perf_counter()
    return {
        "pipeline": "langchain-reference",
        "chunks": len(docs),
        "model_load_s": load_s,
        "split_s": t2 - t1,
        "embed_index_s": t3 - t2,
        "seconds": t3 - t1,
    }


def run_ours(files: list[Path], encoder: str, precision: str, backend: str = "torch") -> dict:
    """Our ingest into a fresh index; encode time measured inside it."""
    from rag.ingest import ingest
    from rag.retrieval.encoder import Encoder

    Encoder.load(encoder, device="cpu", precision=precision, backend=backend)  # export, cache
    t0 = time.perf_counter()
    Encoder.load(encoder, device="cpu", precision=precision, backend=backend)  # time the load
    load_s = time.perf_counter() - t0
    report = ingest(
        files,
        index=f"bench-{backend}-{precision}-{os.getpid()}",
        encoder=encoder,
        device="cpu",
        precision=precision,
        encoder_backend=backend,
        progress=False,
    )
    if not report.ok:
        raise RuntimeError(f"ingest failed: {report.failures[:3]}")
    seconds = report.seconds - load_s  # the ingest loads the model once too
    encode_s = report.timings.get("encode", 0.0)
    return {
        "pipeline": f"ours-{precision}" if backend == "torch" else f"ours-{backend}-{precision}",
        "encoder_backend": backend,
        "precision": precision,
        "chunks": report.chunks,
        "model_load_s": load_s,
        "encode_s": encode_s,
        "seconds": seconds,
        "overhead_vs_encode": (seconds - encode_s) / encode_s if encode_s else None,
        "timings": report.timings,
        "index": report.index,
    }


def scifact_quality(
    folder: str,
    encoder: str,
    n_docs: int,
    precisions: list[str],
    backends: tuple[str, ...] | list[str] = ("torch",),
) -> dict:
    """Dense nDCG@10 on the SciFact dev split per backend and precision (same corpus subset for
    all; ``n_docs`` 0: the whole corpus); keys are the precision (``fp32``, ``bf16``, ``int8``)
    for torch, ``onnx-fp32``/``onnx-int8`` for ONNX, and ``delta_<key>`` is each minus fp32."""
    import pytrec_eval

    from rag.evaluation.datasets import load_beir, scifact_split
    from rag.retrieval.encoder import Encoder
    from rag.retrieval.retriever import CorpusRetriever

    ds = load_beir(folder, split="train")
    _, dev = scifact_split(ds)
    ds = ds.subset(dev)
    judged = sorted({d for q in ds.qrels.values() for d in q})
    others = sorted(set(ds.corpus) - set(judged))
    if n_docs:
        others = random.Random(0).sample(others, min(n_docs, len(others)))
    ids = judged + others
    texts = [ds.doc_text(i) for i in ids]
    out = {"queries": len(ds.queries), "corpus_docs": len(ids), "judged_docs": len(judged)}
    qids = list(ds.queries)
    for backend, precision in [(b, p) for b in backends for p in precisions]:
        enc = Encoder.load(encoder, device="cpu", precision=precision, backend=backend)
        key = precision if backend == "torch" else f"{backend}-{precision}"
        t0 = time.perf_counter()
        r = CorpusRetriever(ids, texts, enc, "dense")
        rows = r.search_many([ds.queries[q] for q in qids], k=10)
        run = {q: {d: float(s) for d, s in row} for q, row in zip(qids, rows)}
        ev = pytrec_eval.RelevanceEvaluator(ds.qrels, {"ndcg_cut.10"})
        scores = [v["ndcg_cut_10"] for v in ev.evaluate(run).values()]
        out[key] = {
            "ndcg@10": sum(scores) / len(qids),
            "seconds": time.perf_counter() - t0,
            "corpus_encode_s": r.timings["corpus_encode_s"],
        }
    runs = [k for k, v in out.items() if isinstance(v, dict) and k != "fp32"]
    for key in runs if "fp32" in out else []:
        out[f"delta_{key}"] = out[key]["ndcg@10"] - out["fp32"]["ndcg@10"]
    return out


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh([r["pipeline"] for r in results], [r["kb_per_s"] for r in results])
    ax.set_xlabel("KB/s (source bytes, model load excluded)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(cfg: ThroughputConfig) -> dict:
    """Every pipeline on the same files (and the SciFact check); writes and returns the summary."""
    import torch

    from rag.models import resolve_model

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    docs = docs_folder(cfg)
    assert docs is not None  # check()
    files = pick_files(docs, cfg.max_bytes)
    nbytes = sum(f.stat().st_size for f in files)
    out = Path(cfg.out) if cfg.out else rag_home() / "benchmarks" / "ingest_throughput"
    out.mkdir(parents=True, exist_ok=True)
    encoder = str(resolve_model(cfg.encoder))  # before RAG_HOME moves: an artefact alias
    os.environ["RAG_HOME"] = tempfile.mkdtemp(prefix="rag-bench-")  # throwaway indexes
    print(f"{len(files)} files, {nbytes:,} bytes from {docs}", file=sys.stderr)
    results = [run_reference(files, Path(encoder))]
    for backend in cfg.encoder_backends.split(","):
        for precision in cfg.precisions.split(","):
            results.append(run_ours(files, encoder, precision, backend))
    for r in results:
        r["kb_per_s"] = nbytes / 1000 / r["seconds"]
        r["chunks_per_s"] = r["chunks"] / r["seconds"]
        r["speedup_vs_reference"] = r["kb_per_s"] / results[0]["kb_per_s"]
        print(
            f"{r['pipeline']:>20}: {r['kb_per_s']:.2f} KB/s, {r['chunks']} chunks, "
            f"{r['seconds']:.1f}s, x{r['speedup_vs_reference']:.2f}",
            file=sys.stderr,
        )
    summary = {
        "config": asdict(cfg),
        "files": len(files),
        "bytes": nbytes,
        "results": results,
        "hardware": f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}",
        "load_average": os.getloadavg(),
    }
    if cfg.scifact:
        summary["scifact"] = scifact_quality(
            cfg.scifact,
            encoder,
            cfg.scifact_docs,
            cfg.precisions.split(","),
            cfg.encoder_backends.split(","),
        )
        print(f"scifact: {json.dumps(summary['scifact'])}", file=sys.stderr)
    (out / "results.json").write_text(json.dumps(summary, indent=1, default=str))
    (out / "run.json").write_text(json.dumps(asdict(cfg), indent=1))
    plot(results, out / "throughput.png")
    return summary


def build_parser() -> Any:
    return config_parser(f"python -m {PROG}", __doc__, ThroughputConfig)


def main(argv: list[str] | None = None) -> int:
    return run_config_cli(build_parser(), ThroughputConfig, run, argv, check=check)


if __name__ == "__main__":
    sys.exit(main())
