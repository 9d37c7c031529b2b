"""The evals' pipeline flags come from rag.config's sections (issue 43), and their defaults are
the ones each eval answered with before the move (HEAD 5fce565), written out here."""

from __future__ import annotations

import importlib
import json

import pytest

from rag.config import ConfigError, field_sections

# RAGConfig's flat defaults before the sections (HEAD 5fce565, RAGConfig() field by field, with
# RetrievalSettings' norm and depth, which that config left at the settings' defaults).
HEAD_DEFAULTS = {
    "index": "default",
    "device": "auto",
    "mode": "hybrid",
    "k": 5,
    "fusion": "convex",
    "alpha": 0.5,
    "norm": "minmax",
    "depth": 100,
    "rerank": "auto",
    "rerank_depth": 10,
    "rerank_weight": 0.5,
    "rerank_precision": "auto",
    "rerank_max_length": None,
    "encoder": None,
    "encoder_backend": "torch",
    "where": (),
    "correct_typos": True,  # since 2026-12-07 (docs/retrieval.md: typos)
    "dedup": 0.7,  # since 2026-12-07 (docs/retrieval.md: near-duplicate hits)
    "min_score": None,
    "reader": "auto",
    "reader_threshold": None,
    "compose": "decoder",
    "evidence_tokens": 320,
    "evidence_passages": 10,
    "quotes": 5,  # since 2026-12-06 (docs/answering.md: quotes for how / why questions; 5 later that day)
    "factoid": "extract",  # since 2026-12-05 (docs/answering.md: a factoid's short answer)
    "literal_terms": True,  # since 2026-12-05 (docs/answering.md: terms no document holds)
    "answerability_threshold": 0.338,
    "refusal_threshold": None,
    "verify_citations": True,
    "complete_citations": True,
    "decoder": "qwen2.5-coder-0.5b",
    "factoid_decoder": "auto",
    "adapter": "auto",
    "engine": "auto",
    "decoder_precision": "auto",
    "profile": "auto",
    "temperature": 0.0,
    "top_p": 1.0,
    "max_new_tokens": 256,
    "max_context_tokens": 2048,
    "prefix_cache": True,
    "prompt_cache_mb": 512,
    "prompt_lookup": 5,  # on since 2026-12-05 (docs/benchmarks.md: same answers, less time)
    "batching": True,
    "max_batch": 16,
    "max_prefill_tokens": 4096,
    "decoder_compile": False,
    "cache_implementation": "dynamic",
}

# What each eval ran the pipeline with at HEAD where that differs from RAGConfig's defaults:
# docqa: rag_config(DocQAConfig()); injection: rag_config(InjectionEvalConfig()) with the
# temporary index built with minilm; qa: the generator's RAGConfig (decoder = --generator,
# batching off) and the pipeline's (QAEvalConfig's answer fields; complete_citations off), the
# retriever (--retriever bm25, minilm, k = 3) and 32 new tokens; answerability: its retriever.
EVALS = {
    "docqa": (
        "DocQAConfig",
        {"index": "pydocs", "decoder": "smollm2", "adapter": None},
        {"questions": "evals/data/pydocs_qa.jsonl", "split": "all", "limit": 0},
    ),
    "qa": (
        "QAEvalConfig",
        {
            "decoder": "smollm2",
            "adapter": None,
            "mode": "bm25",
            "encoder": "minilm",
            "k": 3,
            "max_new_tokens": 32,
            "complete_citations": False,
            "batching": False,
        },
        {
            "squad": "",
            "articles": [],
            "split": "dev",
            "mode": "oracle",
            "limit": 100,
            "seed": 0,
            "removed_articles": 0,
            "unanswerable_limit": 100,
            "embedding_cache": True,
        },
    ),
    "injection": (
        "InjectionEvalConfig",
        {"decoder": "smollm2", "adapter": None, "encoder": "minilm", "k": 4, "max_new_tokens": 64},
        {"fixture": "tests/fixtures/injection", "limit": 0, "verify": True},
    ),
    "answerability": (
        "AnswerabilityEvalConfig",
        {"mode": "hybrid", "encoder": "minilm", "k": 5},
        {
            "squad": "",
            "articles": [],
            "split": "dev",
            "fit": False,
            "model": None,
            "removed_articles": 2,
            "limit": 300,
            "unanswerable_limit": 100,
            "seed": 0,
            "max_false_refusal": 0.05,
            # since 2026-12-06 the eval reads the best sentence too, as the shipped check does
            "units": True,
            "embedding_cache": True,
        },
    ),
}
REQUIRED = {"qa": ["--squad", "s.json"], "answerability": ["--squad", "s.json"]}


def _eval(name: str):
    module = importlib.import_module(f"evals.{name}")
    return module, getattr(module, EVALS[name][0])


def _parser(name: str):
    module, cls = _eval(name)
    return cls.parser(f"python -m evals.{name}", module.__doc__)


@pytest.mark.parametrize("name", sorted(EVALS))
def test_every_setting_is_a_flag_or_excluded_with_a_reason(name):
    module, cls = _eval(name)
    parser = _parser(name)
    dests = {a.dest for a in parser._actions}
    options = set(parser._option_string_actions)
    excluded = module.EXCLUDED
    for setting in field_sections():
        flag = "--" + setting.replace("_", "-")
        if setting in excluded:
            assert isinstance(excluded[setting], str) and excluded[setting].strip(), setting
            # an excluded setting has no flag of its own (qa's --mode is the eval's oracle|rag)
            assert flag not in options or setting in cls.own_fields(), setting
        else:
            assert setting in dests and flag in options, f"evals.{name}: no {flag}"
    assert set(excluded) <= set(field_sections())
    assert set(module.EVAL_DEFAULTS) <= set(field_sections())
    # no eval field repeats a setting it has a flag for: the settings live in ``rag``
    assert not set(cls.own_fields()) & (set(field_sections()) - set(excluded))


@pytest.mark.parametrize("name", sorted(EVALS))
def test_the_default_config_is_the_one_the_eval_ran_with_before(name):
    _, cls = _eval(name)
    _, changed, own = EVALS[name]
    expected = {**HEAD_DEFAULTS, **changed}
    cfg = cls()
    assert cfg.rag.flat() == expected
    assert {n: getattr(cfg, n) for n in cls.own_fields()} == own
    # the command line with no flags builds the same config (the flags start from it)
    args = _parser(name).parse_args(REQUIRED.get(name, []))
    built = cls.from_args(args)
    assert built.rag == cfg.rag
    assert cls.of() == cfg


@pytest.mark.parametrize("name", sorted(EVALS))
def test_flags_set_the_pipeline_and_a_rag_toml_is_never_read(name, tmp_path, monkeypatch):
    _, cls = _eval(name)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rag.toml").write_text('index = "elsewhere"\n[retrieval]\nk = 9\n')
    args = _parser(name).parse_args([*REQUIRED.get(name, []), "--k", "2", "--device", "cpu"])
    cfg = cls.from_args(args)
    assert cfg.rag.retrieval.k == 2 and cfg.rag.device == "cpu"
    assert cfg.rag.index == cls().rag.index != "elsewhere"
    saved = json.loads(json.dumps(cfg.to_dict()))  # the result JSON records every setting
    assert saved["rag"]["retrieval"]["k"] == 2 and saved["rag"]["device"] == "cpu"
    assert set(saved["rag"]["generate"]) >= {"decoder", "adapter", "max_new_tokens"}


def test_qa_keeps_its_flag_names_for_the_decoder_and_the_retrieval_mode():
    _, cls = _eval("qa")
    parser = _parser("qa")
    argv = ["--squad", "s.json", "--mode", "rag", "--retriever", "dense", "--generator", "x"]
    cfg = cls.from_args(parser.parse_args(argv))
    assert cfg.mode == "rag" and cfg.rag.retrieval.mode == "dense"
    assert cfg.rag.generate.decoder == "x"
    same = cls.from_args(parser.parse_args(["--squad", "s.json", "--decoder", "x"]))
    assert same.rag.generate.decoder == "x"
    with pytest.raises(ConfigError, match="--generator and --decoder"):
        cls.from_args(
            parser.parse_args(["--squad", "s.json", "--generator", "x", "--decoder", "y"])
        )
    assert cls.of(generator="x", retriever="dense").rag.retrieval.mode == "dense"
    with pytest.raises(ConfigError, match="batching: fixed by this eval"):
        cls.of(batching=True)


def test_injection_builds_its_index_with_the_encoder_and_queries_with_the_index_own(
    tmp_path, monkeypatch
):
    import evals.injection as injection

    seen = {}

    class Report:
        failures: list = []

    def fake_ingest(paths, index_dir, encoder, device, progress):
        seen.update(encoder=encoder, device=device)
        return Report()

    monkeypatch.setattr("rag.ingest.ingest", fake_ingest)
    monkeypatch.setattr("rag.pipeline.open_retriever", lambda config, index: object())
    cfg = injection.InjectionEvalConfig.of(device="cpu")
    pipe = injection.build_pipeline(cfg, tmp_path, tmp_path / "index", generator=object())
    assert seen == {"encoder": "minilm", "device": "cpu"}
    assert pipe.config.retrieval.encoder is None and pipe.config.generate.decoder == "smollm2"
    assert pipe.config.retrieval.k == 4 and pipe.verify is False
