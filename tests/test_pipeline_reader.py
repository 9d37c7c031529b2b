"""The reader-first pipeline: the reader's span decides the cited passage, the decoder only
phrases it (or nothing is decoded), abstentions fall back or refuse, and the span reaches the
JSON, the HTTP API and the UI with its offsets and escaped."""

from __future__ import annotations

import pytest

import rag.pipeline as pipeline_module
from rag.answer.answerability import AnswerabilityDecision
from rag.answer.prompt import REFUSAL
from rag.answer.reader import Span, SpanReader, sentence_around
from rag.config import RAGConfig
from rag.pipeline import RAGPipeline
from rag.types import Chunk, Hit

PASSAGES = [
    "The Rhine rises in the Alps. It flows to the North Sea.",
    "The Danube is long. It rises in the Black Forest and reaches the Black Sea. Cities line it.",
    "Vienna stands on the Danube.",
]


def hits() -> list[Hit]:
    return [
        Hit(
            Chunk(f"id{i}", t, f"/srv/docs/river{i}.md", ("Rivers",), 100 * i, 100 * i + len(t)),
            0.9 - 0.1 * i,
            rank=i + 1,
        )  # fmt: skip
        for i, t in enumerate(PASSAGES)
    ]


class FakeRetriever:
    def search(self, query, k=5, mode="hybrid"):
        return hits()[:k]


class FakeReader:
    """Scripted spans: ``answers`` maps passage index -> (answer text, margin)."""

    threshold = 0.0  # SpanReader's own, read from reader.json; the tests set the config's

    def threshold_for(self, given):
        return SpanReader.threshold_for(self, given)

    def __init__(self, answers: dict[int, tuple[str, float]]):
        self.answers = answers
        self.calls: list[list[str]] = []

    def read(self, question, passages):
        self.calls.append(list(passages))
        out = []
        for i, (text, margin) in sorted(self.answers.items()):
            a = passages[i].index(text)
            out.append(Span(i, a, a + len(text), text, score=margin, null_score=0.0))
        return out


class FakeGenerator:
    def __init__(self, reply: str):
        self.reply = reply
        self.calls: list[list[dict]] = []
        self.kwargs: list[dict] = []

    def fit_passages(self, question, passages, max_new_tokens=256):
        return list(passages)

    def generate(self, messages, **kw):
        self.calls.append(messages)
        self.kwargs.append(kw)
        return self.reply

    def stream(self, messages, **kw):  # one body with generate, as the engines have
        yield self.generate(messages, **kw)


def make(reply: str, answers: dict, generator: type = FakeGenerator, **cfg) -> RAGPipeline:
    cfg.setdefault("reader_threshold", 1.0)
    return RAGPipeline(
        RAGConfig.of(k=3, **cfg),
        retriever=FakeRetriever(),
        generator=generator(reply),
        reader=FakeReader(answers),
    )


def test_reader_span_picks_the_cited_passage_and_the_decoder_phrases_it():
    pipe = make(
        "The Danube rises in the Black Forest [1].", {0: ("Alps", 2.0), 1: ("Black Forest", 5.0)}
    )
    ans = pipe.answer("Where does the Danube rise?")
    span = ans.answer_span
    assert span.text == "Black Forest" and span.chunk_id == "id1" and span.number == 1
    assert PASSAGES[1][span.start : span.end] == "Black Forest"  # offsets into the passage
    assert (span.source_start, span.source_end) == (100 + span.start, 100 + span.end)
    assert [c.chunk_id for c in ans.citations] == ["id1"]  # right by construction
    assert [h.chunk.id for h in ans.passages] == ["id1", "id0", "id2"]  # [1] = the span's
    assert ans.text == "The Danube rises in the Black Forest."
    (messages,) = pipe.generator.calls
    user = messages[-1]["content"]
    assert PASSAGES[1] in user and PASSAGES[0] not in user and "Short answer: Black Forest" in user
    assert pipe.generator.kwargs[0]["max_new_tokens"] <= pipeline_module.SPAN_MAX_NEW_TOKENS
    assert "[1]" in pipe.generator.kwargs[0]["stop"]  # decoding ends with the citation


def test_a_reply_that_drops_the_span_or_refuses_gives_the_passages_own_sentence():
    for reply in ("It is in Germany [1].", REFUSAL):
        pipe = make(reply, {1: ("Black Forest", 5.0)})
        ans = pipe.answer("Where does the Danube rise?")
        assert ans.text == "It rises in the Black Forest and reaches the Black Sea."
        assert not ans.refused and [c.chunk_id for c in ans.citations] == ["id1"]


def test_compose_extract_decodes_nothing():
    pipe = make("unused", {1: ("Black Forest", 5.0)}, compose="extract")
    ans = pipe.answer("Where does the Danube rise?")
    assert pipe.generator.calls == []
    a = PASSAGES[1].index("Black Forest")
    assert ans.text == sentence_around(PASSAGES[1], a, a + len("Black Forest"))
    assert ans.text == "It rises in the Black Forest and reaches the Black Sea."
    streamed = list(pipe.stream("Where does the Danube rise?"))
    assert streamed[-1].answer_span.text == "Black Forest" and pipe.generator.calls == []


def test_weak_spans_fall_back_to_the_decoder_over_every_passage():
    pipe = make("The Alps [1].", {0: ("Alps", 0.5)})  # below the threshold 1.0
    ans = pipe.answer("Where does the Rhine rise?")
    assert ans.answer_span is None
    user = pipe.generator.calls[0][-1]["content"]
    assert all(p in user for p in PASSAGES)


def _answerability(refuse: bool):
    def check(retriever, query, hits, threshold, literal=True, unit=None):
        return AnswerabilityDecision(0.9 if refuse else 0.1, 0.2, 0.1, refuse)

    return check


def test_refuses_only_when_reader_and_answerability_agree(monkeypatch):
    monkeypatch.setattr(pipeline_module, "check", _answerability(True))
    agree = make("unused", {0: ("Alps", 0.1)})
    ans = agree.answer("What is the capital of Peru?")
    assert ans.refused and agree.generator.calls == []
    confident = make("The Black Forest [1].", {1: ("Black Forest", 5.0)})
    assert confident.answer("Where does the Danube rise?").answer_span is not None
    monkeypatch.setattr(pipeline_module, "check", _answerability(False))
    disagree = make("The Alps [1].", {0: ("Alps", 0.1)})
    assert not disagree.answer("Where does the Rhine rise?").refused
    assert len(disagree.generator.calls) == 1  # the decoder over all passages decided


def test_reader_none_is_the_old_pipeline():
    pipe = RAGPipeline(
        RAGConfig.of(k=3, reader="none"),
        retriever=FakeRetriever(),
        generator=FakeGenerator("X [2]."),
    )
    ans = pipe.answer("q?")
    assert pipe.reader is None and ans.answer_span is None and ans.citations[0].chunk_id == "id1"


def test_missing_reader_names_the_flag(tmp_path):
    pipe = RAGPipeline(RAGConfig.of(reader=str(tmp_path / "nope")), retriever=FakeRetriever())
    with pytest.raises(FileNotFoundError, match="--reader"):
        _ = pipe.reader


def test_answer_span_in_json_and_api_without_the_server_path():
    from rag.serve.api import completion

    ans = make("The Black Forest [1].", {1: ("Black Forest", 5.0)}).answer("Where?")
    d = ans.to_dict()["answer_span"]
    assert d["text"] == "Black Forest" and d["source"] == "/srv/docs/river1.md"
    body = completion({"id": "x", "created": 0, "model": "m"}, ans.text, ans)
    api = body["answer_span"]
    assert api["text"] == "Black Forest" and "source" not in api
    assert (api["start"], api["end"], api["number"]) == (d["start"], d["end"], 1)


class CutGenerator(FakeGenerator):
    """Reports what the real decoder reports when max_new_tokens cut its reply."""

    def generate(self, messages, **kw):
        kw["stats"].update(prompt_tokens=40.0, new_tokens=80.0, finish_reason="length")
        return super().generate(messages, **kw)


def test_finish_reason_and_usage_of_span_answers():
    """A reply around the span that the limit cut is "length"; one replaced by the passage's
    sentence, and an extracted sentence (nothing decoded), are "stop" with zero tokens used
    for the extract (rag.serve's usage, docs/serving.md)."""
    from rag.serve.api import usage

    def answer(reply: str, **cfg):
        pipe = make(reply, {1: ("Black Forest", 5.0)}, CutGenerator, **cfg)
        return pipe.answer("Where does the Danube rise?")

    kept = answer("The Danube rises in the Black Forest and flows")
    assert kept.finish_reason == "length" and usage(kept)["completion_tokens"] == 80
    replaced = answer("The Danube is a long")  # lost the span: the passage's sentence instead
    assert replaced.raw_text.startswith("It rises in the Black Forest")
    assert replaced.finish_reason == "stop"
    extract = answer("unused", compose="extract")
    assert extract.finish_reason == "stop"
    assert usage(extract) == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


def test_ui_shows_the_span_bold_and_highlighted_as_escaped_text():
    from ui.render import reply_markdown, sources_html

    hostile = "<script>alert(1)</script>"
    passages = ["Before. The answer is " + hostile + " here.", "Other."]

    class Retriever:
        def search(self, query, k=5, mode="hybrid"):
            return [
                Hit(Chunk(f"c{i}", t, f"d{i}.md"), 0.9, rank=i + 1) for i, t in enumerate(passages)
            ]

    pipe = RAGPipeline(
        RAGConfig.of(k=2, reader_threshold=1.0, compose="extract"),
        retriever=Retriever(),
        generator=FakeGenerator("unused"),
        reader=FakeReader({0: (hostile, 3.0)}),
    )
    ans = pipe.answer("What is the answer?")
    md = reply_markdown(ans)
    assert md.startswith("**") and "<script>" not in md
    html_ = sources_html(ans, "What is the answer?")
    assert "<script>" not in html_
    assert '<mark class="rag-answer">&lt;script&gt;alert(1)&lt;/script&gt;</mark>' in html_


def test_a_span_only_adapter_phrases_spans_and_the_decoder_alone_answers_the_fallback():
    """The span adapter (run.json prompt_format "span") never sees the k-passage prompt."""
    tuned, alone = (
        FakeGenerator("The Danube rises in the Black Forest [1]."),
        FakeGenerator("The Alps [1]."),
    )

    def pipe(answers):
        return RAGPipeline(
            RAGConfig.of(k=3, reader_threshold=1.0),
            retriever=FakeRetriever(),
            generator=tuned,
            fallback_generator=alone,
            reader=FakeReader(answers),
        )

    assert pipe({1: ("Black Forest", 5.0)}).answer("Where does the Danube rise?").answer_span
    assert len(tuned.calls) == 1 and alone.calls == []
    fell_back = pipe({0: ("Alps", 0.5)})  # weak span: the k-passage prompt
    assert fell_back.answer("Where does the Rhine rise?").answer_span is None
    assert list(fell_back.stream("Where does the Rhine rise?"))[-1].answer_span is None
    assert len(tuned.calls) == 1 and len(alone.calls) == 2
    assert all(p in alone.calls[0][-1]["content"] for p in PASSAGES)
    # passed one generator only (tests, evals reusing a model): it answers both prompts
    shared = make("The Alps [1].", {0: ("Alps", 0.5)})
    assert shared.fallback_generator is shared.generator


def test_fallback_generator_is_loaded_without_the_adapter_only_for_span_adapters(
    tmp_path, monkeypatch
):
    import json

    monkeypatch.setenv("RAG_HOME", str(tmp_path))
    loaded = []
    import rag.generate.load

    monkeypatch.setattr(
        rag.generate.load,
        "load_decoder",
        lambda settings, device, adapter, lazy=False: loaded.append(adapter) or adapter,
    )
    for name, fmt in (("span-lora", "span"), ("k-lora", "passages")):
        folder = tmp_path / "models" / name
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text("{}")
        (folder / "run.json").write_text(json.dumps({"prompt_format": fmt}))
    span = RAGPipeline(RAGConfig.of(adapter="span-lora"))
    assert (span.generator, span.fallback_generator) == ("span-lora", None)
    k = RAGPipeline(RAGConfig.of(adapter="k-lora"))
    assert k.fallback_generator == k.generator == "k-lora"
    assert loaded == ["span-lora", None, "k-lora"]  # each decoder loaded once


def test_the_server_shares_its_decoders_across_indexes(monkeypatch):
    from rag.serve import state

    made = []

    class Pipeline:  # stands in for RAGPipeline: the host loads (fakes), the others are given
        def __init__(self, config, generator=None, fallback_generator=None, factoid_generator=None):
            if generator is None:
                made.append(self)
                generator, fallback_generator = FakeGenerator("a"), FakeGenerator("b")
                factoid_generator = FakeGenerator("c")
            self.generator, self.fallback_generator = generator, fallback_generator
            self.factoid_generator = factoid_generator

    monkeypatch.setattr(pipeline_module, "RAGPipeline", Pipeline)
    build = state.decoder_sharing_factory()  # what rag.serve builds its pipelines with
    one, two = build(RAGConfig.of(index="one")), build(RAGConfig.of(index="two"))
    assert len(made) == 1  # one host: one copy of each decoder for every index
    host = made[0]
    assert one.generator.reply == two.generator.reply == "a"
    assert one.fallback_generator.reply == two.fallback_generator.reply == "b"
    assert one.factoid_generator.reply == two.factoid_generator.reply == "c"
    assert one.generator.ensure_loaded() is host.generator  # the preload's path (load_models)
    assert two.factoid_generator.ensure_loaded() is host.factoid_generator


def test_the_uis_pipelines_share_decoders_across_indexes_not_across_decoders(monkeypatch):
    """The chat UI picks the index and the models per request: a second index with the same
    decoders loads no second copy of them; another decoder gets its own, and only the most
    recently used ``keep`` decoder sets are kept for new pipelines."""
    from rag.serve import state

    loaded = []

    class Pipeline:  # the host loads a fake per decoder; the others are given stand-ins
        def __init__(self, config, generator=None, fallback_generator=None, factoid_generator=None):
            if generator is None:
                loaded.append(config.generate.decoder)
                generator = fallback_generator = factoid_generator = FakeGenerator(
                    config.generate.decoder
                )
            self.generator, self.fallback_generator = generator, fallback_generator
            self.factoid_generator = factoid_generator

    monkeypatch.setattr(pipeline_module, "RAGPipeline", Pipeline)
    build = state.decoder_sharing_factory(keep=1)
    one, two = build(RAGConfig.of(index="one")), build(RAGConfig.of(index="two"))
    assert one.generator.reply == two.factoid_generator.reply == "qwen2.5-coder-0.5b"
    assert loaded == ["qwen2.5-coder-0.5b"]  # one copy for both indexes
    other = build(RAGConfig.of(index="one", decoder="smollm2"))
    assert other.generator.reply == "smollm2" and loaded[-1] == "smollm2"
    build(RAGConfig.of(index="three"))  # the 0.5B's set was dropped (keep=1): loaded anew
    _ = build(RAGConfig.of(index="three")).generator.reply
    assert loaded == ["qwen2.5-coder-0.5b", "smollm2", "qwen2.5-coder-0.5b"]


def test_a_front_ends_preload_loads_the_decoders_it_shares_through_their_stand_ins(monkeypatch):
    """The UI's pipelines hold stand-ins of shared decoders, which load on first use:
    ``load_models`` (the UI's warm-up) must load every one now, the factoid decoder too, not
    leave them for the first question."""
    from rag.models import registry
    from rag.serve import state

    loaded = []

    def load(self, adapter):
        loaded.append(adapter)
        return FakeGenerator("answer")

    monkeypatch.setattr(RAGPipeline, "_load_decoder", load)
    monkeypatch.setattr(pipeline_module, "open_retriever", lambda config: "retriever")
    monkeypatch.setattr(registry, "is_installed", lambda pkg: False)  # the 0.5B copies factoids
    pipe = state.decoder_sharing_factory()(RAGConfig.of(index="one"))
    assert loaded == []  # built, nothing loaded yet
    pipe.load_models()
    assert loaded == ["auto"]  # the decoder (its adapter setting), once: it serves all three
    assert pipe.factoid_generator.reply == "answer" and loaded == ["auto"]


def test_the_preload_builds_the_engines_the_pipeline_loaded_lazily(monkeypatch):
    """The pipeline loads its OpenVINO decoders lazily (the tokenizer now, the engine at the
    first request: a factoid answered by the 1.5B never builds the 0.5B's); a front end's
    preload must build them now, through the server's shared stand-ins too."""
    from rag.models import registry
    from rag.serve import state

    built = []

    class LazyEngine(FakeGenerator):
        def ensure_loaded(self):
            built.append(self.reply)
            return self

    monkeypatch.setattr(RAGPipeline, "_load_decoder", lambda self, adapter: LazyEngine("a"))
    monkeypatch.setattr(pipeline_module, "open_retriever", lambda config: "retriever")
    monkeypatch.setattr(registry, "is_installed", lambda pkg: False)  # the 0.5B copies factoids
    shared = state.decoder_sharing_factory()(RAGConfig.of(index="one"))
    own = RAGPipeline(RAGConfig.of(index="one"))
    for pipe in (shared, own):
        built.clear()
        pipe.load_models()
        assert built and set(built) == {"a"}  # built now, not at the first question


def test_the_preload_loads_the_query_encoder_too(monkeypatch):
    """The index's encoder (it embeds the question and picks the answering sentences) loads on
    first use; ``load_models`` is the front ends' preload, so it must load it, once, or the
    first question after start-up pays the encoder's load."""

    class LazyEncoderRetriever:
        loads = 0

        @property
        def encoder(self):
            LazyEncoderRetriever.loads += 1
            return "encoder"

    monkeypatch.setattr(RAGPipeline, "_load_decoder", lambda self, adapter: FakeGenerator("a"))
    monkeypatch.setattr(pipeline_module, "open_retriever", lambda config: LazyEncoderRetriever())
    pipe = RAGPipeline(RAGConfig.of(index="one", decoder="smollm2", reader="none"))
    assert LazyEncoderRetriever.loads == 0  # built, nothing loaded yet
    pipe.load_models()
    assert LazyEncoderRetriever.loads == 1
