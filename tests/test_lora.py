"""LoRA grounded-answer tuning with a tiny decoder: data format, label masking, the loss falls,
adapter and merged folders load back equal, held-out articles never reach training."""

from __future__ import annotations

import json

import pytest
import torch
from training_support import build_tokenizer, save_tiny_decoder, write_tiny_squad

from rag.answer.prompt import REFUSAL, build_messages, parse_citations
from rag.evaluation.datasets import load_squad_paragraphs
from training.data.lora_data import assert_no_heldout, read_examples, squad_examples, write_examples
from training.data.qa_example import QAExample
from training.finetune.lora import LoraTrainConfig, encode_example, fit
from training.finetune.lora_eval import score_answers


@pytest.fixture(scope="module")
def squad(tmp_path_factory):
    return write_tiny_squad(tmp_path_factory.mktemp("squad") / "squad.json")


def test_examples_cite_the_gold_passage_and_round_trip(squad):
    examples = squad_examples(squad, "train", n=40, k=3, refusal_fraction=0.3, seed=0)
    assert len(examples) == 24  # every train question (4 articles x 3 paragraphs x 2)
    assert any(not e.answerable for e in examples) and any(e.answerable for e in examples)
    paragraphs = {p.id: p.context for p in load_squad_paragraphs(squad)}
    for ex in examples:
        assert len(ex.passages) == 3 and len(set(ex.passage_ids)) == 3
        assert [paragraphs[i] for i in ex.passage_ids] == ex.passages
        parsed = parse_citations(ex.target, len(ex.passages))
        assert parsed.cited == ex.cited
        if ex.answerable:
            gold = ex.passages[ex.cited[0] - 1]
            assert ex.answers[0] in gold and parsed.text == ex.answers[0]
        else:
            assert parsed.refused and ex.target == REFUSAL
            assert not any(ex.answers[0].lower() in p.lower() for p in ex.passages)


def test_train_examples_never_use_heldout_articles(squad):
    examples = squad_examples(squad, "train", n=100, k=3)
    assert all(
        e.article != "Normans" and not any(i.startswith("Normans/") for i in e.passage_ids)
        for e in examples
    )
    dev = squad_examples(squad, "dev", n=100, k=3)
    assert dev and all(e.article == "Normans" for e in dev)
    with pytest.raises(AssertionError):
        assert_no_heldout(dev, ["Normans"], load_squad_paragraphs(squad))


def test_trim_passage_keeps_the_answer():
    from training.data.qa_example import trim_passage

    text = (
        " ".join(f"w{i}" for i in range(100))
        + " the answer here "
        + " ".join(f"v{i}" for i in range(100))
    )
    cut = trim_passage(text, 20, ["answer here"])
    assert len(cut.split()) == 20 and "answer here" in cut
    assert trim_passage(text, 20, ["absent"]).startswith("w0 w1")
    assert trim_passage(text, 0, ["answer"]) == text


def test_examples_file_round_trip(squad, tmp_path):
    examples = squad_examples(squad, "train", n=5, k=2)
    write_examples(examples, tmp_path / "ex.jsonl")
    assert read_examples(tmp_path / "ex.jsonl") == examples


def test_labels_cover_only_the_answer_turn():
    tok = build_tokenizer()
    ex = QAExample(
        "1", "What opens files?", ["open opens files", "sockets"], [1], ["open"], "open [1]", "A"
    )
    row = encode_example(tok, ex, max_length=2048)
    n_prompt = sum(label == -100 for label in row["labels"])
    prompt = tok.apply_chat_template(
        build_messages(ex.question, ex.passages), add_generation_prompt=True, tokenize=False
    )
    assert tok.decode(row["input_ids"][:n_prompt]) == prompt
    supervised = [t for t in row["labels"] if t != -100]
    assert tok.decode(supervised) == "open [1]<|im_end|>"
    assert encode_example(tok, ex, max_length=10) is None


def test_score_answers():
    ex = [
        QAExample("1", "q", ["a", "b"], [2], ["Denver Broncos"], "Denver Broncos [2]", "A"),
        QAExample("2", "q", ["a", "b"], [], ["x"], REFUSAL, "A", answerable=False),
    ]
    perfect = score_answers(ex, ["the Denver Broncos [2]", REFUSAL])
    assert (
        perfect["em"] == 100
        and perfect["citation_accuracy"] == 100
        and perfect["refusal_accuracy"] == 100
    )
    wrong = score_answers(ex, ["Broncos [1]", "Denver [1]"])
    assert wrong["em"] == 0 and 0 < wrong["f1"] < 100 and wrong["citation_accuracy"] == 0
    assert wrong["refusal_accuracy"] == 0


def test_lora_loss_falls_and_artefacts_load_back(squad, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base_dir = save_tiny_decoder(tmp_path / "base")
    out = tmp_path / "lora"
    cfg = LoraTrainConfig(
        model=str(base_dir), out=str(out), data=[str(squad)], r=4, alpha=8, dropout=0.0, epochs=4,
        batch_size=4, grad_accum=1, lr=5e-3, warmup_ratio=0.0, k_passages=2, max_examples=16,
        passage_words=12, eval_examples=2, eval_batch_size=2, max_new_tokens=3, merge=True,
        logging_steps=1, device="cpu", threads=1, precision="fp32",
    )  # fmt: skip
    merged, tok, summary = fit(cfg)
    rows = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) >= 10 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3
    assert summary["n_train_examples"] == 16 and summary["before"]["n_answerable"] >= 1
    assert (out / "adapter_config.json").exists() and (out / "adapter_model.safetensors").exists()

    base = AutoModelForCausalLM.from_pretrained(base_dir)
    ids = tok("Question: What is the file of Alpha_topic?", return_tensors="pt")["input_ids"]
    plain = base(ids).logits
    adapted = PeftModel.from_pretrained(base, str(out)).eval()
    with torch.no_grad():
        with_adapter = adapted(ids).logits
        from_merged = AutoModelForCausalLM.from_pretrained(out / "merged")(ids).logits
        in_memory = merged.eval()(ids).logits
    assert not torch.allclose(plain, with_adapter, atol=1e-4)  # the adapter changes the model
    assert torch.allclose(with_adapter, from_merged, atol=1e-4)  # merged folder = base + adapter
    assert torch.allclose(in_memory, from_merged, atol=1e-5)  # saved = what was trained


def save_tiny_qwen2(path, seed: int = 0):
    """A plain HF Qwen2 causal LM folder (the architecture of Qwen2/2.5) with a chat template."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = build_tokenizer()
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
    )  # fmt: skip
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_llama_and_qwen2_take_named_modules_and_doc_examples(arch, squad, tmp_path):
    """Both architectures name their linear layers q/k/v/o_proj + gate/up/down_proj; a run mixing
    SQuAD and doc examples adapts exactly those and saves an adapter that loads back."""
    from pathlib import Path

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base_dir = (save_tiny_decoder if arch == "llama" else save_tiny_qwen2)(tmp_path / "base")
    names = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    cfg = LoraTrainConfig(
        model=str(base_dir), out=str(tmp_path / "lora"), data=[str(squad)],
        docs=[str(Path(__file__).parent / "fixtures" / "corpus")], doc_fraction=0.5, r=2,
        alpha=4, target_modules=names, max_steps=2, batch_size=2, grad_accum=1, k_passages=2,
        max_examples=8, passage_words=12, doc_passage_words=40, eval_examples=2,
        eval_batch_size=2, max_new_tokens=2, logging_steps=1, device="cpu", threads=1,
    )  # fmt: skip
    model, _, summary = fit(cfg)
    assert summary["n_train_doc_examples"] == 4 and summary["steps"] == 2
    assert summary["before"]["n_answerable"] + summary["before"]["n_unanswerable"] == 2
    lora_a = [n.split(".lora_A")[0] for n, _ in model.named_parameters() if ".lora_A" in n]
    assert {n.rsplit(".", 1)[-1] for n in lora_a} == set(names)
    saved = json.loads((tmp_path / "lora" / "adapter_config.json").read_text())
    assert set(saved["target_modules"]) == set(names)
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), cfg.out)  # loads


def test_top_layers_picks_the_last_n_and_rejects_too_many():
    from types import SimpleNamespace

    from training.finetune.lora import top_layer_ids

    model = SimpleNamespace(config=SimpleNamespace(num_hidden_layers=24))
    assert top_layer_ids(model, 0) is None
    assert top_layer_ids(model, 3) == [21, 22, 23]
    with pytest.raises(ValueError, match="--top-layers must be in"):
        top_layer_ids(model, 25)


def test_all_linear_with_top_layers_lists_the_linear_layers(tmp_path):
    """The README's LoRA line: --top-layers with the default all-linear target (peft refuses
    layers_to_transform with its "all-linear" string)."""
    from transformers import AutoModelForCausalLM

    from training.finetune.lora import lora_targets

    model = AutoModelForCausalLM.from_pretrained(save_tiny_decoder(tmp_path / "base"))
    names = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert lora_targets(model, ["all-linear"], 0) == "all-linear"
    assert lora_targets(model, names[:2], 1) == names[:2]
    assert sorted(lora_targets(model, ["all-linear"], 1)) == sorted(names)  # no lm_head
