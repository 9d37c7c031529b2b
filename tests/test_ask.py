"""python -m rag.ask: --json, --stream, config layering and one-line errors (fake models)."""

from __future__ import annotations

import json

import pytest
from test_pipeline import FakeGenerator, FakeRetriever, hit

import rag.pipeline
from rag import ask


@pytest.fixture
def fake_pipeline(monkeypatch):
    """rag.ask builds RAGPipeline(cfg); give it fake models and remember the config."""
    seen = {}
    real = rag.pipeline.RAGPipeline

    def factory(cfg, **kw):
        seen["config"], seen["kw"] = cfg, kw
        return real(
            cfg,
            retriever=FakeRetriever([hit(1), hit(2)]),
            generator=FakeGenerator("Use open() [2] [5]."),
        )

    monkeypatch.setattr(rag.pipeline, "RAGPipeline", factory)
    return seen


def test_json_output(fake_pipeline, capsys):
    assert ask.main(["how?", "--index", "pydocs", "--k", "2", "--mode", "dense", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["text"] == "Use open()."
    assert [c["number"] for c in out["citations"]] == [2]
    assert out["citations"][0]["chunk_id"] == "id2"
    assert out["invalid_citations"] == [5]
    cfg = fake_pipeline["config"]
    assert (cfg.index, cfg.retrieval.k, cfg.retrieval.mode) == ("pydocs", 2, "dense")


def test_stream_prints_tokens_then_sources(fake_pipeline, capsys):
    assert ask.main(["how?", "--stream"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Use open() [2] [5].")
    assert "Sources:\n[2] docs/f2.md › Guide › Part 2" in out
    assert "dropped citation(s) naming no given passage: 5" in out


def test_stream_json_is_pure_json(fake_pipeline, capsys):
    assert ask.main(["how?", "--stream", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["raw_text"] == "Use open() [2] [5]."


def test_rag_toml_in_cwd_then_flags(fake_pipeline, tmp_path, monkeypatch, capsys):
    (tmp_path / "rag.toml").write_text('index = "from-toml"\nk = 4\n')
    monkeypatch.chdir(tmp_path)
    assert ask.main(["q", "--k", "3"]) == 0
    cfg = fake_pipeline["config"]
    assert (cfg.index, cfg.retrieval.k) == ("from-toml", 3)


def test_bad_config_is_one_line_error(fake_pipeline, tmp_path, capsys):
    bad = tmp_path / "x.toml"
    bad.write_text("colour = 1\n")
    assert ask.main(["q", "--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "colour" in err and str(bad) in err


def test_bad_flag_value_is_an_error(fake_pipeline, tmp_path, monkeypatch, capsys):
    for argv, needle in ((["--mode", "fuzzy"], "'fuzzy'"), (["--k", "five"], "'five'")):
        with pytest.raises(SystemExit) as e:  # argparse's own refusal: one line
            ask.main(["q", *argv])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and "\n" not in err and needle in err, err
        assert err.startswith(f"rag.ask: error: argument {argv[0]}")
    assert ask.main(["q", "--k", "0"]) == 2  # a value RAGConfig refuses, named as in rag.toml
    assert capsys.readouterr().err.strip() == "rag.ask: error: --k must be positive, not 0"
    (tmp_path / "rag.toml").write_text('mode = "fuzzy"\n')
    monkeypatch.chdir(tmp_path)
    assert ask.main(["q"]) == 2
    assert "mode must be one of dense, bm25, hybrid, not 'fuzzy'" in capsys.readouterr().err


def test_none_flag_overrides_the_file(fake_pipeline, tmp_path, monkeypatch):
    """``--min-score none`` is a value given (None), not "no flag": it beats rag.toml."""
    (tmp_path / "rag.toml").write_text("min_score = 0.3\nk = 4\n")
    monkeypatch.chdir(tmp_path)
    assert ask.main(["q", "--min-score", "none"]) == 0
    cfg = fake_pipeline["config"]
    assert cfg.answer.min_score is None and cfg.retrieval.k == 4


def test_index_dir_opens_that_folder(fake_pipeline, tmp_path, tiny_mlm_dir, capsys):
    from ingest_support import write_docs

    from rag.ingest import ingest

    folder = tmp_path / "somewhere" / "idx"
    ingest([write_docs(tmp_path / "docs")], folder, str(tiny_mlm_dir), progress=False)
    assert ask.main(["how?", "--index-dir", str(folder), "--json"]) == 0
    assert fake_pipeline["kw"]["retriever"].root == folder
    capsys.readouterr()
    assert ask.main(["how?", "--index", "a", "--index-dir", str(folder)]) == 2
    assert "not both" in capsys.readouterr().err


def test_sources_show_the_relative_path(monkeypatch, capsys):
    """Citations show the path relative to the ingested folder; "source" stays absolute."""
    from dataclasses import replace

    hits = [hit(1), hit(2)]
    hits[1] = replace(
        hits[1], chunk=replace(hits[1].chunk, source="/srv/x/docs/f2.md", path="f2.md")
    )

    real = rag.pipeline.RAGPipeline

    def factory(cfg, **kw):
        return real(cfg, retriever=FakeRetriever(hits), generator=FakeGenerator("Use open() [2]."))

    monkeypatch.setattr(rag.pipeline, "RAGPipeline", factory)
    assert ask.main(["how?"]) == 0
    out = capsys.readouterr().out
    assert "[2] f2.md › Guide › Part 2" in out and "/srv/x" not in out
    assert ask.main(["how?", "--json"]) == 0
    cited = json.loads(capsys.readouterr().out)["citations"][0]
    assert cited["path"] == "f2.md" and cited["source"] == "/srv/x/docs/f2.md"


def test_a_refusal_lists_the_closest_passages_uncited():
    """A question the documents seem not to answer (often one asked in other words than
    theirs) still shows where retrieval looked, at most CLOSEST_SHOWN passages, none numbered
    as a citation; an answer's sources are unchanged."""
    from rag.types import Answer, Citation

    hits = [hit(i) for i in range(1, 6)]
    refused = ask.format_sources(
        Answer("The documents do not contain the answer.", refused=True, passages=hits)
    ).splitlines()
    assert refused[0].startswith("(none judged to answer")
    assert refused[1:] == [f"- docs/f{i}.md › Guide › Part {i}" for i in (1, 2, 3)]
    assert not any(line.startswith("[") for line in refused)
    assert (
        ask.format_sources(Answer("The documents do not contain the answer.", refused=True)) == ""
    )
    c = hits[1].chunk
    answered = Answer(
        "Use open().", [Citation(2, c.source, c.heading_path, c.text, 0.5, c.id)], passages=hits
    )
    assert ask.format_sources(answered) == "[2] docs/f2.md › Guide › Part 2  (0.500)"


def test_the_query_searched_is_said_when_typos_were_corrected(monkeypatch, capsys):
    class Correcting(FakeRetriever):
        def correct_typos(self, query):
            from rag.retrieval.spelling import Corrected

            return Corrected(query.replace("opne", "open"), [("opne", "open")])

    real = rag.pipeline.RAGPipeline

    def factory(cfg, **kw):
        return real(cfg, retriever=Correcting([hit(1)]), generator=FakeGenerator("Use it [1]."))

    monkeypatch.setattr(rag.pipeline, "RAGPipeline", factory)
    assert ask.main(["how do I opne it?"]) == 0
    assert "(searched for: how do I open it?)" in capsys.readouterr().out
    assert ask.main(["how do I open it?"]) == 0  # nothing corrected: nothing said
    assert "searched for" not in capsys.readouterr().out
    assert ask.main(["how do I opne it?", "--no-correct-typos"]) == 0
    assert "searched for" not in capsys.readouterr().out
