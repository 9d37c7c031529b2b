"""Column recipes of the division-of-labour experiment: how one model is scored on retrieval,
bits per byte, grounded QA and reading, each through the module a user would run for it."""

from __future__ import annotations

from pathlib import Path

from evals.division_of_labor.presets import ExperimentConfig, ExperimentPreset
from rag.evaluation.datasets import RetrievalDataset


def score_retrieval(encoder, sets: dict[str, RetrievalDataset], mode: str = "dense") -> dict:
    """nDCG@10 (and the other metrics) of ``encoder`` on each dev set, via evals.retrieval; the
    corpus vectors go through the embedding cache (a baseline such as minilm is encoded once
    across runs and presets), whose hits and misses the cell keeps."""
    from evals.retrieval import RetrievalEvalConfig, evaluate
    from rag.retrieval.embedding_cache import EmbeddingCache

    out: dict = {}
    cache = EmbeddingCache() if mode != "bm25" else None
    for name, ds in sets.items():
        cfg = RetrievalEvalConfig(dataset=name, retriever=mode)
        r = evaluate(cfg, encoder=encoder, ds=ds, embeddings=cache)
        out[name] = r["metrics"]["ndcg@10"]
        out[f"{name}_metrics"] = r["metrics"]
    if cache is not None:
        out["embedding_cache"] = {"hits": cache.hits, "misses": cache.misses}
    return out


def score_bpb(
    model_dir: Path | str, cfg: ExperimentConfig, p: ExperimentPreset, device: str
) -> dict:
    """Bits per byte, left to right, on WikiText-2 validation (evals.lm), every model with the
    same left context: the pretraining sequence length, the longest the rows were trained on."""
    from evals.lm import bits_per_byte, load_lm, read_texts

    model, tok, objective = load_lm(str(model_dir), "auto", device)
    text = read_texts([cfg.wikitext])
    r = bits_per_byte(
        model, tok, text, objective, max_tokens=p.bpb_tokens, context=p.seq_len, device=device
    )
    return {"wikitext_bpb": r["bits_per_byte"], "objective": objective, **r}


def score_qa(
    model_dir: str, adapter: Path | None, cfg: ExperimentConfig, p: ExperimentPreset, device: str
) -> dict:
    """EM/F1 and citation accuracy, oracle passages on the SQuAD dev articles (evals.qa)."""
    from evals.qa import QAEvalConfig, evaluate_qa
    from rag.generate.generator import Generator

    gen = Generator.load(
        model_dir, adapter=str(adapter) if adapter else None, device=device, precision="fp32"
    )
    qcfg = QAEvalConfig.of(
        squad=cfg.squad, generator=model_dir, mode="oracle", k=p.qa_k, limit=p.qa_questions
    )
    r = evaluate_qa(qcfg, generator=gen, progress=False)
    return {**r["metrics"], "n_questions": r["n_questions"], "examples": r["predictions"][:3]}


def score_reading(summary: dict) -> dict:
    """The reading cell from a training.finetune.reader run summary: EM/F1 as fractions (like the QA
    column) on the SQuAD dev articles' gold paragraphs, plus the untrained-head score and the
    null-threshold calibration the run also measured."""
    dev, before = summary["dev"], summary.get("dev_before_200", {})
    return {
        "em": dev["em"] / 100,
        "f1": dev["f1"] / 100,
        "n_questions": dev["questions"],
        "f1_before": before.get("f1", 0.0) / 100,
        "calibration": summary.get("calibration"),
        "train_windows": summary.get("windows"),
        "train_seconds": summary.get("train_seconds"),
        "reader_dir": summary.get("out"),
    }
