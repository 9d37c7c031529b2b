"""The reader-first LoRA (``training.finetune.lora --prompt-format span``): its examples (one
passage, the span, the sentence holding it; never a held-out article), the reply check that decides
which distilled replies become targets and scores held-out replies, label masking on the span
prompt, and a tiny run whose adapter records what rag needs to use it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from training_support import save_tiny_decoder, write_tiny_squad

from rag.answer.prompt import SPAN_SYSTEM_PROMPT, format_span_target
from rag.evaluation.datasets import squad_split
from training.data.lora_data import doc_span_examples, span_examples, span_training_examples
from training.data.qa_example import QAExample, example_messages
from training.finetune.lora import LoraTrainConfig, distill_span_targets, encode_example, fit
from training.finetune.lora_eval import score_span_answers, span_reply_check

CORPUS = Path(__file__).parent / "fixtures" / "corpus"


@pytest.fixture(scope="module")
def squad(tmp_path_factory):
    return write_tiny_squad(tmp_path_factory.mktemp("squad") / "squad.json")


def _span(passage: str, span: str, question: str = "What is it?") -> QAExample:
    return QAExample(
        id="x", question=question, passages=[passage], cited=[1], answers=[span],
        target=format_span_target(passage), article="a", kind="span",
    )  # fmt: skip


def test_span_examples_hold_the_span_and_its_sentence_and_no_heldout_article(squad):
    train, dev = squad_split(squad)
    ex = span_examples(squad, "train", 0)
    assert ex and all(e.kind == "span" and e.cited == [1] and len(e.passages) == 1 for e in ex)
    for e in ex:
        assert e.article in train and e.answers[0] in e.passages[0]
        sentence = e.target.removesuffix(" [1]")
        assert e.target.endswith(" [1]") and e.answers[0] in sentence
        assert sentence in e.passages[0] and sentence != e.passages[0]  # one sentence, not all
    held = span_examples(squad, "dev", 0)
    assert held and {e.article for e in held} <= set(dev)
    assert len(span_examples(squad, "train", 3)) == 3
    with pytest.raises(ValueError, match="--split"):
        span_examples(squad, "test", 1)


def test_doc_span_examples_point_at_the_section_lead_in_its_section():
    ex = doc_span_examples([CORPUS], 0)
    assert ex
    for e in ex:
        assert e.kind == "span" and len(e.passages) == 1 and e.answers[0] in e.passages[0]
        assert e.target == format_span_target(e.answers[0])


def test_span_mix_takes_the_doc_share(squad):
    mix = span_training_examples([str(squad)], [str(CORPUS)], 10, doc_fraction=0.3)
    docs = [e for e in mix if e.article not in squad_split(squad)[0]]
    assert len(mix) == 10 and len(docs) == 3
    with pytest.raises(ValueError, match="--data"):
        span_training_examples([], [], 5)


def test_reply_check_keeps_the_span_and_stays_in_the_passage():
    ex = _span("The Broncos beat the Panthers 24-10 in Super Bowl 50. It was in 2016.", "Broncos")
    assert span_reply_check("The Broncos beat the Panthers [1]", ex) == (True, True)
    # what follows the first [1] is never shown (decoding stops there)
    assert span_reply_check("The Broncos won [1] and then Denver lost", ex)[0]
    assert span_reply_check("The Panthers lost the game. [1]", ex) == (False, False)
    # "Denver" is not in the passage: kept, not grounded
    assert span_reply_check("The Broncos beat Denver [1]", ex) == (True, False)
    assert span_reply_check("The documents do not contain the answer.", ex) == (False, False)
    assert span_reply_check("", ex) == (False, False)
    scores = score_span_answers([ex, ex], ["The Broncos beat the Panthers [1]", "Denver [1]"])
    assert scores["span_kept"] == 50 and scores["grounded"] == 50
    assert scores["kept_and_grounded"] == 50 and scores["cites_1"] == 100 and scores["n_span"] == 2


def test_span_prompt_labels_cover_only_the_reply(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(save_tiny_decoder(tmp_path / "base"))
    ex = _span("Alpha is beta. Gamma uses delta.", "beta", "What is alpha?")
    msgs = example_messages(ex)
    assert msgs[0]["content"] == SPAN_SYSTEM_PROMPT and "Short answer: beta" in msgs[1]["content"]
    row = encode_example(tok, ex, 1024)
    supervised = [t for t, lab in zip(row["input_ids"], row["labels"]) if lab != -100]
    assert "Alpha is beta" in tok.decode(supervised) and "Short answer" not in tok.decode(
        supervised
    )


def test_distillation_replaces_only_replies_that_pass_the_check(monkeypatch, tmp_path):
    from transformers import AutoTokenizer

    import training.finetune.lora as lora

    good = _span("Alpha is beta. Gamma uses delta.", "beta")
    bad = _span("Alpha is beta. Gamma uses delta.", "beta")
    cut = _span("Alpha is beta. Gamma uses delta.", "beta")
    done = _span("Alpha is beta. Gamma uses delta.", "beta")
    # the third reply reached the token cap (80 tokens) without [1]: cut, never a target; the
    # fourth ended by itself without writing [1] (what the zero-shot model does)
    replies = [
        "Alpha is beta, as stated [1]",
        "Alpha is epsilon beta [1]",
        "Alpha is beta" + " beta" * 90,
        "Alpha is beta.",
    ]
    monkeypatch.setattr(lora, "generate_answers", lambda *a, **k: replies)
    tok = AutoTokenizer.from_pretrained(save_tiny_decoder(tmp_path / "base"))
    assert distill_span_targets(None, tok, [good, bad, cut, done], LoraTrainConfig()) == 2
    assert good.target == "Alpha is beta, as stated [1]" and done.target == "Alpha is beta. [1]"
    sentence = format_span_target("Alpha is beta. Gamma uses delta.")
    assert bad.target == sentence and cut.target == sentence  # kept


def test_span_lora_trains_and_records_its_format(squad, tmp_path):
    out = tmp_path / "span-lora"
    cfg = LoraTrainConfig(
        model=str(save_tiny_decoder(tmp_path / "base")), out=str(out), data=[str(squad)],
        prompt_format="span", span_targets="distill", r=4, alpha=8, dropout=0.0, epochs=3,
        batch_size=4, grad_accum=1, lr=5e-3, warmup_ratio=0.0, max_examples=8, eval_examples=2,
        eval_batch_size=2, max_new_tokens=4, logging_steps=1, device="cpu", threads=1,
        precision="fp32",
    )  # fmt: skip
    _, _, summary = fit(cfg)
    run = json.loads((out / "run.json").read_text())
    assert run["prompt_format"] == "span" and run["profile"] == "plain"  # the base's own
    assert 0 <= run["n_distilled_targets"] <= 8 and run["n_train_examples"] == 8
    assert {"span_kept", "grounded", "n_span"} <= set(summary["after"])
    assert summary["after"]["n_span"] == 2
    losses = [json.loads(x).get("loss") for x in (out / "train_log.jsonl").read_text().splitlines()]
    losses = [x for x in losses if x is not None]
    assert len(losses) >= 4 and losses[-1] < losses[0]
    with pytest.raises(ValueError, match="--prompt-format"):
        fit(LoraTrainConfig(prompt_format="chat", out=str(tmp_path / "x")))


def test_the_answers_table_trains_what_make_models_trains(tmp_path):
    """evals/answers_table.sh spells make models' recipe out as flags: the two must not drift."""
    import re
    import shlex

    from training_support import span_recipe_drift

    script = (Path(__file__).parents[1] / "evals" / "answers_table.sh").read_text()
    joined = script.replace("\\\n", " ")
    line = next(
        x
        for x in joined.splitlines()
        if "--prompt-format span" in x and "training.finetune.lora" in x
    )
    argv = shlex.split(line.split("training.finetune.lora", 1)[1])
    values = {"$Q": "qwen", "$S": "squad.json", "$DATA": "data"}
    argv = [re.sub(r"\$\w+", lambda m: values.get(m.group(0), m.group(0)), a) for a in argv]
    skip = {"model", "out", "data", "docs", "device"}
    assert not span_recipe_drift(argv, tmp_path, "small", skip)
