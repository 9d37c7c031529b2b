"""RAGPipeline: citations map to the given passages, invalid numbers are flagged, refusal without
calling the model, relevance gate, query rewrite hook, streaming, shared lazy loading."""

from __future__ import annotations

import threading

import pytest
from test_generate import tiny_decoder_dirs  # noqa: F401  (session fixture)

from rag.answer.prompt import REFUSAL
from rag.answer.relevance import hybrid_is_relevant, relevant_hits
from rag.config import RAGConfig
from rag.pipeline import RAGPipeline
from rag.types import Answer, Chunk, Hit


def hit(i: int, score: float = 0.5, mode: str = "dense") -> Hit:
    chunk = Chunk(f"id{i}", f"text of chunk {i}", f"docs/f{i}.md", ("Guide", f"Part {i}"), 0, 10)
    return Hit(chunk, score, rank=i, mode=mode)


class FakeRetriever:
    def __init__(self, hits: list[Hit]):
        self.hits = hits
        self.queries: list[tuple[str, int, str]] = []

    def search(self, query: str, k: int = 5, mode: str = "hybrid") -> list[Hit]:
        self.queries.append((query, k, mode))
        return self.hits[:k]


class FakeGenerator:
    """Replies with a scripted text; ``keep`` limits how many passages fit the budget."""

    def __init__(self, reply: str, keep: int | None = None):
        self.reply = reply
        self.keep = keep
        self.calls: list[list[dict[str, str]]] = []

    def fit_passages(self, question, passages, max_new_tokens=256):
        return list(passages)[: self.keep]

    def generate(self, messages, **kw):
        self.calls.append(messages)
        kw["stats"].update(ttft_s=0.1, total_s=0.2, new_tokens=3)
        return self.reply

    def stream(self, messages, **kw):  # one body with generate, as the engines have
        words = self.generate(messages, **kw).split(" ")
        yield from [w if i == 0 else " " + w for i, w in enumerate(words)]


def pipeline(hits, reply, keep=None, **cfg) -> RAGPipeline:
    return RAGPipeline(
        RAGConfig.of(**cfg), retriever=FakeRetriever(hits), generator=FakeGenerator(reply, keep)
    )


def test_citations_map_to_given_passages():
    pipe = pipeline([hit(1, 0.9), hit(2, 0.8), hit(3, 0.7)], "Use a for loop [2][3].", k=3)
    ans = pipe.answer("how do I read lines?")
    assert ans.text == "Use a for loop."
    assert [c.number for c in ans.citations] == [2, 3]
    c = ans.citations[0]
    assert (c.chunk_id, c.source, c.text, c.score) == ("id2", "docs/f2.md", "text of chunk 2", 0.8)
    assert c.heading_path == ("Guide", "Part 2")
    assert [h.chunk.id for h in ans.passages] == ["id1", "id2", "id3"]
    assert ans.invalid_citations == [] and not ans.refused
    assert ans.timings["ttft_s"] == 0.1
    # the prompt numbered the passages in rank order
    user = pipe.generator.calls[0][1]["content"]
    assert user.index("[1] text of chunk 1") < user.index("[2] text of chunk 2")


def test_invalid_citation_dropped_and_flagged():
    pipe = pipeline([hit(1), hit(2)], "It is X [2] [7].", k=2)
    ans = pipe.answer("q?")
    assert [c.number for c in ans.citations] == [2]
    assert ans.invalid_citations == [7]
    assert "[7]" not in ans.text and "7" not in [str(c.number) for c in ans.citations]


def test_citation_beyond_trimmed_passages_is_invalid():
    # Five hits retrieved but only two fit the budget: [4] names no passage the model saw.
    pipe = pipeline([hit(i) for i in range(1, 6)], "A [1] B [4]", keep=2, k=5)
    ans = pipe.answer("q?")
    assert len(ans.passages) == 2
    assert [c.number for c in ans.citations] == [1] and ans.invalid_citations == [4]


def test_no_hits_refuses_without_calling_model():
    pipe = pipeline([], "should not be called")
    ans = pipe.answer("anything?")
    assert ans.refused and ans.text == REFUSAL and ans.citations == []
    assert pipe.generator.calls == []


def test_low_scores_refuse_in_dense_mode():
    pipe = pipeline([hit(1, 0.05), hit(2, 0.01)], "nope", mode="dense")
    assert pipe.answer("unrelated?").refused
    assert pipe.generator.calls == []


def test_min_score_override_and_partial_filter():
    hits = [hit(1, 0.9), hit(2, 0.1), hit(3, 0.6)]
    assert [h.chunk.id for h in relevant_hits(hits, "dense")] == ["id1", "id3"]
    assert [h.chunk.id for h in relevant_hits(hits, "dense", min_score=0.95)] == []
    assert relevant_hits([hit(1, 0.0, "bm25")], "bm25") == []


def test_hybrid_relevance_uses_component_scores_when_present():
    class Fused(Hit):
        pass

    plain = [hit(1, 0.03, "hybrid")]
    assert hybrid_is_relevant(plain)  # no component scores: any hit counts
    assert not hybrid_is_relevant([])
    weak = Fused(plain[0].chunk, 0.03, 1, "hybrid")
    object.__setattr__(weak, "dense_score", 0.05)
    object.__setattr__(weak, "bm25_score", 0.0)
    assert not hybrid_is_relevant([weak])
    object.__setattr__(weak, "bm25_score", 2.5)
    assert hybrid_is_relevant([weak])


def test_model_refusal_has_no_citations():
    pipe = pipeline([hit(1)], REFUSAL + " [1]")
    ans = pipe.answer("q?")
    assert ans.refused and ans.citations == [] and ans.text == REFUSAL


def test_rewrite_hook_used_with_history_and_recorded():
    seen = []

    def rewrite(question, history):
        seen.append(history)
        return "how do I read a file in python line by line"

    pipe = RAGPipeline(
        RAGConfig.of(k=2),
        retriever=FakeRetriever([hit(1)]),
        generator=FakeGenerator("ok [1]"),
        rewrite_query=rewrite,
    )
    history = [("user", "reading files in python"), {"role": "assistant", "content": "use open"}]
    ans = pipe.answer("and line by line?", history=history)
    assert ans.query == "how do I read a file in python line by line"
    assert pipe.retriever.queries[0] == (ans.query, 2, "hybrid")
    assert seen == [[("user", "reading files in python"), ("assistant", "use open")]]
    # without history the hook is not consulted
    assert pipe.answer("plain question").query == "plain question"
    assert len(seen) == 1


def test_k_and_mode_arguments_override_config():
    pipe = pipeline([hit(i) for i in range(1, 9)], "x [1]", k=5, mode="hybrid")
    ans = pipe.answer("q", k=3, mode="bm25")
    assert pipe.retriever.queries[-1] == ("q", 3, "bm25")
    assert len(ans.passages) == 3


def test_stream_yields_deltas_then_answer():
    pipe = pipeline([hit(1), hit(2)], "Use open() [1].")
    items = list(pipe.stream("q?"))
    assert isinstance(items[-1], Answer)
    assert "".join(items[:-1]) == "Use open() [1]."
    assert items[-1].text == "Use open()." and [c.number for c in items[-1].citations] == [1]


def test_stream_refusal():
    items = list(pipeline([], "x").stream("q?"))
    assert items[0] == REFUSAL and isinstance(items[1], Answer) and items[1].refused


def test_empty_question_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        pipeline([hit(1)], "x").answer("  ")


def test_models_load_once_across_threads(monkeypatch):
    import rag.generate.generator

    loads = []

    def fake_load(name, **kw):
        loads.append(name)
        threading.Event().wait(0.05)  # widen the race window
        return FakeGenerator("x")

    monkeypatch.setattr(rag.generate.generator.Generator, "load", staticmethod(fake_load))
    pipe = RAGPipeline(RAGConfig.of(decoder="tiny"), retriever=FakeRetriever([hit(1)]))
    got = []
    threads = [threading.Thread(target=lambda: got.append(pipe.generator)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loads == ["tiny"]
    assert len({id(g) for g in got}) == 1


def test_answer_to_dict_is_json_ready():
    import json

    ans = pipeline([hit(1)], "yes [1] [9]").answer("q?")
    d = json.loads(json.dumps(ans.to_dict()))
    assert d["citations"][0]["chunk_id"] == "id1" and d["invalid_citations"] == [9]


def test_real_tiny_generator_composes(tiny_decoder_dirs):  # noqa: F811
    """The real Generator under the pipeline: citations always resolve to given passages."""
    from rag.generate.generator import Generator

    gen = Generator.load(tiny_decoder_dirs["llama"], device="cpu", max_context_tokens=256)
    hits = [
        Hit(Chunk(f"c{i}", "read the file line by line " * 20, f"s{i}.md"), 0.9 - i / 10)
        for i in range(5)
    ]
    pipe = RAGPipeline(
        RAGConfig.of(k=5, max_new_tokens=16), retriever=FakeRetriever(hits), generator=gen
    )
    ans = pipe.answer("how do I read a file?")
    given = {h.chunk.id for h in ans.passages}
    assert 0 < len(ans.passages) < 5  # budget of 256 tokens trims the list
    assert all(c.chunk_id in given for c in ans.citations)
    assert all(n > len(ans.passages) or n < 1 for n in ans.invalid_citations)
    streamed = list(pipe.stream("how do I read a file?"))
    assert streamed[-1].raw_text == ans.raw_text


def test_answer_text_keeps_line_breaks_of_code():
    reply = "Loop over the file [1]:\n\n```python\nfor line in f:\n    print(line)\n```"
    ans = pipeline([hit(1)], reply).answer("q?")
    assert ans.text == "Loop over the file:\n\n```python\nfor line in f:\n    print(line)\n```"


# ---- citation completion ----------------------------------------------------------------------


class ScoringGenerator(FakeGenerator):
    """A fake generator that also scores continuations with fixed log-probabilities."""

    def __init__(self, reply: str, scores: list[float], keep: int | None = None):
        super().__init__(reply, keep)
        self.scores = scores
        self.scored: list[tuple[str, list[str]]] = []

    def score_continuations(self, messages, answer, continuations):
        self.scored.append((answer, list(continuations)))
        return self.scores[: len(continuations)]


def scoring_pipeline(hits, reply, scores, **cfg) -> RAGPipeline:
    gen = ScoringGenerator(reply, scores)
    return RAGPipeline(RAGConfig.of(**cfg), retriever=FakeRetriever(hits), generator=gen)


def test_completion_appends_the_likeliest_marker():
    pipe = scoring_pipeline([hit(1), hit(2), hit(3)], "Use a for loop.", [-5.0, -0.5, -2.0], k=3)
    ans = pipe.answer("q?")
    assert pipe.generator.scored == [("Use a for loop.", [" [1]", " [2]", " [3]"])]
    assert ans.citations_completed and [c.number for c in ans.citations] == [2]
    assert ans.citations[0].chunk_id == "id2"
    assert ans.text == "Use a for loop." and ans.raw_text == "Use a for loop."
    assert ans.citation_logprobs == [-5.0, -0.5, -2.0]
    assert "cite_s" in ans.timings
    d = ans.to_dict()
    assert d["citations_completed"] is True and d["citation_logprobs"] == [-5.0, -0.5, -2.0]


def test_completion_fires_when_only_invalid_markers():
    pipe = scoring_pipeline([hit(1), hit(2)], "It is X [7].", [-0.1, -3.0], k=2)
    ans = pipe.answer("q?")
    assert ans.citations_completed and [c.number for c in ans.citations] == [1]
    assert ans.invalid_citations == [7]


@pytest.mark.parametrize("reply", ["Use open() [3].", REFUSAL])
def test_completion_never_fires_on_cited_or_refused_answers(reply):
    pipe = scoring_pipeline([hit(1), hit(2), hit(3)], reply, [0.0, -1.0, -2.0], k=3)
    ans = pipe.answer("q?")
    assert pipe.generator.scored == [] and not ans.citations_completed
    assert [c.number for c in ans.citations] == ([] if reply == REFUSAL else [3])


def test_code_index_is_not_a_citation_so_completion_fires():
    pipe = scoring_pipeline([hit(1), hit(2)], "Read lines[1] in a loop.", [-4.0, -1.0], k=2)
    ans = pipe.answer("q?")
    assert ans.text == "Read lines[1] in a loop." and ans.invalid_citations == []
    assert ans.citations_completed and [c.number for c in ans.citations] == [2]


def test_completion_off_when_disabled():
    pipe = scoring_pipeline([hit(1), hit(2)], "Use a loop.", [-1.0, -0.1], complete_citations=False)
    ans = pipe.answer("q?")
    assert pipe.generator.scored == [] and ans.citations == [] and not ans.citations_completed
    items = list(pipe.stream("q?"))
    assert "".join(items[:-1]) == "Use a loop." and items[-1].citations == []


def test_stream_sends_completed_marker_last():
    pipe = scoring_pipeline([hit(1), hit(2)], "Use a loop.", [-1.0, -0.1], k=2)
    items = list(pipe.stream("q?"))
    assert items[-2] == " [2]" and "".join(items[:-1]) == "Use a loop. [2]"
    ans = items[-1]
    assert ans.citations_completed and [c.number for c in ans.citations] == [2]
    assert ans.raw_text == "Use a loop."


def test_complete_citations_from_flag_and_toml(tmp_path):
    from rag.ask import build_parser
    from rag.config import config_from_args, load_config

    assert RAGConfig().answer.complete_citations is True
    args = build_parser().parse_args(["q?", "--no-complete-citations"])
    assert config_from_args(args).answer.complete_citations is False
    toml = tmp_path / "rag.toml"
    toml.write_text("complete-citations = false\n", encoding="utf-8")
    assert load_config(toml).answer.complete_citations is False


def test_real_tiny_generator_completion_is_the_argmax(tiny_decoder_dirs):  # noqa: F811
    """With a real (tiny, random) model the completed marker names a given passage and is the
    argmax of log p(" [i]" | prompt, answer), computed here with one full forward pass per i."""
    import torch

    from rag.generate.generator import Generator
    from rag.pipeline import complete_citation

    gen = Generator.load(tiny_decoder_dirs["llama"], device="cpu")
    hits = [Hit(Chunk(f"c{i}", f"passage {i} about files", f"s{i}.md"), 0.9) for i in range(3)]
    pipe = RAGPipeline(RAGConfig.of(k=3), retriever=FakeRetriever(hits), generator=gen)
    prep = pipe.prepare("how do I read a file?")
    raw = "Use open and a for loop."
    ans = complete_citation(raw, prep, gen)
    n = len(prep.hits)
    assert n == 3 and ans.citations_completed and len(ans.citations) == 1
    tok = gen.tokenizer
    base = gen.prompt_ids(prep.messages)[0] + tok(raw, add_special_tokens=False)["input_ids"]
    expected = []
    for i in range(1, n + 1):
        cont = tok(f" [{i}]", add_special_tokens=False)["input_ids"]
        with torch.inference_mode():
            logits = gen.model(input_ids=torch.tensor([base + cont]))["logits"][0]
        logp = torch.log_softmax(logits.float(), dim=-1)
        expected.append(sum(float(logp[len(base) + j - 1, t]) for j, t in enumerate(cont)))
    assert ans.citation_logprobs == pytest.approx(expected, abs=1e-4)
    assert ans.citations[0].number == max(range(n), key=lambda i: expected[i]) + 1
    assert 1 <= ans.citations[0].number <= n
