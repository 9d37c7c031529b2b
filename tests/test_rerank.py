"""Reranker: hard-negative mining never returns a positive; a tiny training run saves a plain
CrossEncoder folder that scores like the in-memory model; the rerank stage and the evals CLI use
it; the dev splits never reach a training example (on the real data when it is present)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from training_support import (
    WORDS,
    save_tiny_cross_encoder,
    save_tiny_decoder,
    save_tiny_encoder,
    write_pairs_file,
    write_tiny_squad,
)

from rag.retrieval.settings import RetrievalSettings
from training.data.rerank_data import Pool, interleave, mine_hard_negatives, mine_pool
from training.finetune.rerank import RerankConfig, build_model, collect_examples, fit, main

# ---------------------------------------------------------------------------- mining (pure)


def test_mining_skips_positives_duplicates_and_the_query():
    texts = {
        "p1": "the gold passage",
        "p1-copy": "The  gold passage",  # same text as the positive under another id
        "n1": "a hard negative",
        "n1-copy": "a hard negative",  # same text as a negative already taken
        "q-copy": "what is gold",  # the query itself, as a document
        "n2": "another negative",
        "n3": "a third negative",
    }
    ranked = ["p1", "p1-copy", "q-copy", "n1", "n1-copy", ("n2", 0.5), "p1", "n3"]
    got = mine_hard_negatives(["What is gold"], [{"p1"}], [ranked], n=5, text_of=texts)
    assert got == [["n1", "n2", "n3"]]
    # without texts only ids can be checked: positives by id, no id twice
    assert mine_hard_negatives(["q"], [["p1"]], [ranked], n=3) == [["p1-copy", "q-copy", "n1"]]
    assert mine_hard_negatives(["q"], [["p1"]], [ranked], n=2, skip=3) == [["n1", "n1-copy"]]
    assert mine_hard_negatives(["q"], [["p1"]], [["p1"]], n=2) == [[]]
    with pytest.raises(ValueError, match="one of each per query"):
        mine_hard_negatives(["q", "r"], [["p1"]], [ranked], n=2)


def test_mining_never_returns_a_positive_on_random_lists():
    rng = random.Random(0)
    docs = [f"d{i}" for i in range(30)]
    texts = {d: f"text {int(d[1:]) % 20}" for d in docs}  # d0 and d20 share a text, etc.
    for _ in range(200):
        pos = set(rng.sample(docs, rng.randint(1, 4)))
        ranked = [rng.choice(docs) for _ in range(40)]  # duplicates included
        for text_of in (None, texts):
            (neg,) = mine_hard_negatives(["query"], [pos], [ranked], rng.randint(1, 8), text_of)
            assert not set(neg) & pos and len(set(neg)) == len(neg)
            if text_of:
                assert not {texts[d] for d in neg} & {texts[p] for p in pos}
                assert len({texts[d] for d in neg}) == len(neg)


def test_random_negatives_are_extra_allowed_and_never_positive():
    corpus = {f"d{i}": f"passage number {i}" for i in range(40)}
    corpus["d39"] = corpus["d0"]  # a duplicate of a positive's text under another id
    allowed = {f"d{i}" for i in range(40) if i != 7}
    pool = Pool("t", corpus, ["q one", "q two"], [["d0"], ["d1", "d2"]], allowed)

    def search(queries, k, mode):  # the same ranking for every query and miner
        return [[(f"d{i}", 1.0 / (i + 1)) for i in range(k)] for _ in queries]

    for seed in range(20):
        out = mine_pool(pool, search, ["bm25"], n=2, depth=5, seed=seed, n_random=3)
        for ex, pos in zip(out, pool.positives):
            assert len(ex.negatives) == 5 and len(set(ex.negatives)) == 5
            assert not set(ex.negatives) & {corpus[p] for p in pos}
            assert corpus["d7"] not in ex.negatives  # outside the allowed ids
        assert out[0].negatives[:2] == [corpus["d1"], corpus["d2"]]  # hard ones first


def test_interleave_alternates_and_dedups():
    assert interleave([["a", "b", "c"], [("b", 1.0), ("d", 0.5)]]) == ["a", "b", "d", "c"]
    assert interleave([]) == []


# ---------------------------------------------------------------------------- training


def _cfg(model, out, **kw) -> RerankConfig:
    base = dict(
        model=str(model),
        out=str(out),
        mine=["bm25"],
        negatives=2,
        eval=False,
        max_steps=3,
        batch_size=8,
        lr=1e-3,
        max_length=32,
        logging_steps=1,
        warmup_ratio=0.0,
        device="cpu",
        threads=1,
        rerank_depth=5,
    )
    return RerankConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def tiny_reranker(tmp_path_factory):
    """A tiny BERT trained 3 steps on synthetic pairs with BM25-mined negatives."""
    base = tmp_path_factory.mktemp("rerank")
    enc = save_tiny_encoder(base / "enc")
    pairs = write_pairs_file(base / "pairs.jsonl", n=24)
    out = base / "ce"
    model, summary = fit(_cfg(enc, out, pairs=[str(pairs)]))
    return model, summary, out


def test_saved_reranker_loads_and_scores_like_the_trained_one(tiny_reranker):
    from sentence_transformers import CrossEncoder

    model, summary, out = tiny_reranker
    assert summary["steps"] == 3 and summary["n_rows"] == 24 * 3  # 1 positive + 2 negatives
    assert summary["settings"] == {"max_length": 32, "rerank_depth": 5}
    for name in ("run.json", "train_log.jsonl", "loss.png", "config.json"):
        assert (out / name).exists(), name
    assert json.loads((out / "config_sentence_transformers.json").read_text())["model_type"] == (
        "CrossEncoder"
    )
    loaded = CrossEncoder(str(out), device="cpu")
    pairs = [("open file read", "open a file and read it"), ("socket server", "dict value")]
    assert np.allclose(model.predict(pairs), loaded.predict(pairs), atol=1e-6)
    assert loaded.max_seq_length == 32
    losses = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert sum("loss" in r for r in losses) == 3


def test_rerank_stage_loads_the_folder_and_keeps_the_tail(tiny_reranker):
    import torch

    from rag.retrieval.rerank import CrossEncoderReranker
    from rag.retrieval.retriever import CorpusRetriever

    model, _, out = tiny_reranker
    reranker = CrossEncoderReranker(out, device="cpu", max_length=32, precision="fp32")
    texts = ["open a file", "socket server client", "read a line", "cache index", "dict value"]
    raw = model.predict([("open file", t) for t in texts], activation_fn=torch.nn.Identity())
    assert reranker.score("open file", texts) == pytest.approx(list(raw), abs=1e-5)
    ids = [f"t{i}" for i in range(len(texts))]
    plain = CorpusRetriever(ids, texts, None, RetrievalSettings(mode="bm25"))
    ranked = CorpusRetriever(
        ids, texts, None, RetrievalSettings(mode="bm25", rerank_depth=2), reranker=reranker
    )
    first = plain.search("open a file read line", k=5)
    got = ranked.search("open a file read line", k=5)
    assert sorted(d for d, _ in got[:2]) == sorted(d for d, _ in first[:2])  # reranked head
    assert [d for d, _ in got[2:]] == [d for d, _ in first[2:]]  # tail in first-stage order
    scores = [s for _, s in got]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores)
    assert ranked.search("open a file read line", k=5, rerank=False) == first


def test_index_retriever_with_reranker_name_and_fusion(tiny_reranker, tiny_mlm_dir, tmp_path):
    """Retriever.open takes the reranker as an artefact name, with max_length and rerank_depth;
    fusion options and rerank=False work per call; reranked hits keep their component scores."""
    import shutil

    from ingest_support import write_docs

    from rag.ingest import ingest
    from rag.retrieval.retriever import Retriever
    from rag.storage.paths import models_dir

    _, _, ce = tiny_reranker
    models_dir().mkdir(parents=True, exist_ok=True)
    shutil.copytree(ce, models_dir() / "tiny-rerank", dirs_exist_ok=True)
    ingest([write_docs(tmp_path / "docs")], index="rr", encoder=str(tiny_mlm_dir), progress=False)
    r = Retriever.from_settings(
        "rr", RetrievalSettings(rerank_depth=3, rerank_max_length=32, rerank="tiny-rerank")
    )
    assert r.reranker.model.max_seq_length == 32 and r.engine.settings.rerank_depth == 3
    q = "read a file line by line"
    hits = r.search(q, k=5)
    assert [h.mode for h in hits[:3]] == ["rerank"] * 3 and hits[3].mode == "hybrid"
    assert all(h.dense_score is not None or h.bm25_score is not None for h in hits)
    plain = Retriever.from_settings("rr").search(q, k=5)
    assert [h.chunk.id for h in r.search(q, k=5, rerank=False)] == [h.chunk.id for h in plain]
    dense = Retriever.from_settings("rr").search(q, k=5, mode="dense")
    convex = r.search(q, k=5, settings=r.settings.replace(alpha=1.0), rerank=False)
    assert [h.chunk.id for h in convex] == [h.chunk.id for h in dense]


def test_not_a_cross_encoder_is_refused(tmp_path):
    from rag.retrieval.rerank import CrossEncoderReranker

    enc = save_tiny_encoder(tmp_path / "enc")  # a plain bi-encoder folder: random head
    with pytest.raises(ValueError, match="not a cross-encoder"):
        CrossEncoderReranker(enc, device="cpu")
    with pytest.raises(LookupError, match="training.finetune.rerank"):
        CrossEncoderReranker("no-such-reranker", device="cpu")
    with pytest.raises(ValueError, match="causal LM"):
        build_model(str(save_tiny_decoder(tmp_path / "dec")), 32, "cpu")


def test_int8_reranker_ranks_like_fp32(tmp_path):
    """precision="int8" quantises the transformer's Linear layers (the bi-encoder's recipe, the
    scoring head left fp32) and keeps the fp32 ranking: on a tiny random BERT with well-spread
    scores, Spearman >= 0.85 over 12 passages and fp32's best passage in int8's top 3."""
    import torch
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    from rag.retrieval.rerank import CrossEncoderReranker

    ce = save_tiny_cross_encoder(tmp_path / "ce")
    fp32 = CrossEncoderReranker(ce, device="cpu", precision="fp32")
    int8 = CrossEncoderReranker(ce, precision="int8")  # device auto: CPU for int8
    assert int8.precision == "int8" and int8.model.device.type == "cpu"
    hf = int8.model.model
    assert isinstance(hf.bert.encoder.layer[0].attention.self.query, DynamicLinear)
    assert type(hf.classifier) is torch.nn.Linear  # the head stays fp32
    texts = [" ".join(WORDS[i : i + 6]) for i in range(0, 36, 3)]
    a = np.array(fp32.score("open a file and read a line", texts))
    b = np.array(int8.score("open a file and read a line", texts))
    assert np.ptp(a) > 0.1  # scores that a ranking can be read from
    rank_a, rank_b = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    assert np.corrcoef(rank_a, rank_b)[0, 1] >= 0.85
    assert int(np.argmax(a)) in np.argsort(b)[-3:].tolist()
    with pytest.raises(ValueError, match="CPU only"):
        CrossEncoderReranker(ce, device="cuda", precision="int8")
    with pytest.raises(ValueError, match="fp32, bf16, int8"):
        CrossEncoderReranker(ce, device="cpu", precision="fp16")


def test_bf16_reranker_keeps_the_fp32_ranking(tmp_path):
    """precision="bf16" casts the whole cross-encoder to bfloat16 and returns float scores
    close to fp32's (the ranking of 12 passages: Spearman >= 0.95, same best passage)."""
    import torch

    from rag.retrieval.rerank import CrossEncoderReranker

    ce = save_tiny_cross_encoder(tmp_path / "ce")
    fp32 = CrossEncoderReranker(ce, device="cpu", precision="fp32")
    bf16 = CrossEncoderReranker(ce, device="cpu", precision="bf16")
    assert {p.dtype for p in bf16.model.model.parameters()} == {torch.bfloat16}
    texts = [" ".join(WORDS[i : i + 6]) for i in range(0, 36, 3)]
    a = np.array(fp32.score("open a file and read a line", texts))
    b = np.array(bf16.score("open a file and read a line", texts))
    assert b.dtype == np.float64 and np.ptp(a) > 0.1
    rank_a, rank_b = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    assert np.corrcoef(rank_a, rank_b)[0, 1] >= 0.95
    assert int(np.argmax(a)) == int(np.argmax(b))


def test_squad_with_mnrl_and_dev_eval(tmp_path):
    """SQuAD train questions only (the tiny file's held-out article is Normans), the listwise
    loss, and the before/after rerank eval on the dev article's questions."""
    squad = write_tiny_squad(tmp_path / "squad.json")
    enc = save_tiny_encoder(tmp_path / "enc")
    cfg = _cfg(enc, tmp_path / "ce", squad=str(squad), loss="mnrl", eval=True, max_steps=2)
    examples, _ = collect_examples(cfg)
    assert len(examples) == 4 * 3 * 2  # 4 train articles x 3 paragraphs x 2 questions
    assert not any("Normans" in t for ex in examples for t in (ex.query, *ex.positives))
    assert not any("Normans" in t for ex in examples for t in ex.negatives)
    assert all(len(ex.negatives) == 2 for ex in examples)
    assert all(not set(ex.negatives) & set(ex.positives) for ex in examples)
    _, summary = fit(cfg)
    dev = summary["after"]["squad-dev"]
    assert dev["n_queries"] == 6 and 0.0 <= dev["ndcg@10"] <= 1.0 and "base_ndcg@10" in dev


def test_from_our_mlm_encoder(tiny_mlm_dir, tmp_path):
    from sentence_transformers import CrossEncoder

    pairs = write_pairs_file(tmp_path / "pairs.jsonl", n=8)
    out = tmp_path / "ce"
    model, _ = fit(_cfg(tiny_mlm_dir, out, pairs=[str(pairs)], max_steps=2))
    archs = json.loads((out / "config.json").read_text())["architectures"]
    assert archs[0].endswith("ForSequenceClassification")
    loaded = CrossEncoder(str(out), device="cpu")
    pairs = [("open a file", "read the file line by line")]
    assert np.allclose(model.predict(pairs), loaded.predict(pairs), atol=1e-6)


def test_cli_reports_a_bad_flag(tmp_path, capsys):
    pairs = write_pairs_file(tmp_path / "pairs.jsonl", n=4)
    assert main(["--model", str(tmp_path / "missing"), "--pairs", str(pairs), "--no-eval"]) == 2
    assert "missing" in capsys.readouterr().err
    assert main(["--pairs", str(pairs), "--loss", "hinge", "--no-eval"]) == 2
    assert "--loss" in capsys.readouterr().err


# ---------------------------------------------------------------------------- evals with the reranker


def test_evals_table_rows_with_reranker_and_latency(tiny_reranker, tmp_path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from test_evals_retrieval import write_mini_beir

    from evals.retrieval import main as eval_main

    _, _, ce = tiny_reranker
    folder = write_mini_beir(tmp_path / "mini")
    enc = save_tiny_encoder(tmp_path / "enc")
    st = SentenceTransformer(
        modules=[Transformer(str(enc), max_seq_length=32), Pooling(64, "mean"), Normalize()]
    )
    st.save(str(tmp_path / "st"))
    common = ["--dataset", str(folder), "--encoder", str(tmp_path / "st"), "--device", "cpu"]
    out = tmp_path / "table.json"
    argv = [*common, "--retriever", "bm25", "hybrid", "--fusion", "rrf", "convex"]
    argv += ["--rerank", str(ce), "--rerank-on", "hybrid", "--rerank-depth", "3", "--latency"]
    assert eval_main([*argv, "--tune-queries", "all", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["row"] for r in rows] == ["bm25", "hybrid", "hybrid-convex", "hybrid+rerank(w=1)"]
    assert all(r["latency_ms_p50"] is not None for r in rows)
    assert rows[2]["fusion_tuning"]["tuned_on_reported_queries"] is True
    assert rows[3]["search_timings"]["rerank_s"] > 0 and rows[1]["search_timings"]["rerank_s"] == 0
    plain = tmp_path / "plain.json"
    assert eval_main([*common, "--retriever", "hybrid", "--out", str(plain)]) == 0
    assert json.loads(plain.read_text())["metrics"] == rows[1]["metrics"]  # default unchanged
    assert eval_main([*common, "--retriever", "bm25", "--alpha", "2"]) == 2  # a bad value


# ---------------------------------------------------------------------------- real data


def test_dev_queries_never_in_training_examples(shared_data):
    """On the real SciFact and SQuAD files: no training query is a dev query, no passage is a
    SQuAD dev-article paragraph, and no negative is a positive of its query."""
    from rag.evaluation.datasets import load_beir, load_squad, scifact_split, squad_split

    scifact = shared_data / "scifact"
    squad = shared_data / "squad" / "squad-v1.1-dev-part.json"
    cfg = RerankConfig(scifact=str(scifact), squad=str(squad), mine=["bm25"], negatives=4)
    examples, _ = collect_examples(cfg)  # raises itself if a dev text got through
    beir = load_beir(scifact, "train")
    dev_claims = {beir.queries[q] for q in scifact_split(beir)[1]}
    train_articles, dev_articles = squad_split(squad)
    dev_squad = load_squad(squad, articles=dev_articles)
    dev_paragraphs = {
        dev_squad.doc_text(d) for d in dev_squad.corpus if dev_squad.doc_group[d] in dev_articles
    }
    queries = {ex.query for ex in examples}
    assert not queries & dev_claims and not queries & set(dev_squad.queries.values())
    passages = {t for ex in examples for t in (*ex.positives, *ex.negatives)}
    assert not passages & dev_paragraphs
    assert all(not set(ex.negatives) & set(ex.positives) for ex in examples)
    kinds = {ex.kind for ex in examples}
    assert kinds == {"scifact", "squad"} and len(examples) > 1000


def test_auto_precision_follows_the_hardware(tmp_path, monkeypatch):
    """rerank_precision auto (the product default) is bf16 where bf16 runs fast (CUDA, a CPU with
    bf16 units) and fp32 elsewhere; explicit values pass through."""
    import rag.models.precision
    from rag.config import RAGConfig
    from rag.models.precision import resolve_precision
    from rag.retrieval.rerank import CrossEncoderReranker
    from rag.retrieval.settings import DEFAULTS

    assert RAGConfig().retrieval.rerank_precision == DEFAULTS.rerank_precision == "auto"
    assert resolve_precision("auto", "cuda") == "bf16"
    assert resolve_precision("int8", "cpu") == "int8"
    ce = save_tiny_cross_encoder(tmp_path / "ce")
    for has_bf16, expected in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(rag.models.precision, "cpu_has_bf16", lambda v=has_bf16: v)
        assert resolve_precision("auto", "cpu") == expected
        assert CrossEncoderReranker(ce, device="cpu", precision="auto").precision == expected
        assert CrossEncoderReranker(ce, device="cpu").precision == expected  # auto: the default
