"""The torch engine's weights: :func:`load_generator`, (model, tokenizer) for a causal LM folder
or alias with an optional LoRA adapter folded in, at a precision and with the decode-speed options
of :mod:`rag.generate.speed`.

Its own module because :class:`rag.generate.generator.Generator` loads through it while
:func:`rag.generate.load.load_decoder` (which re-exports it) builds a ``Generator``: one module
holding both would close an import cycle. In :mod:`rag.generate`, not :mod:`rag.models`, because
it needs :mod:`rag.generate.speed`: ``rag.generate`` imports ``rag.models``, never the reverse.
"""

from __future__ import annotations

from pathlib import Path

from rag.generate.speed import DecodeSpeed
from rag.models import pick_device, resolve_model
from rag.models.loading import MODEL_LOAD_LOCK
from rag.models.precision import check_precision, float_precision, torch_dtype


def load_generator(
    name: str | Path,
    adapter: str | Path | None = None,
    device: str = "auto",
    precision: str = "fp32",
    speed: DecodeSpeed | None = None,
):
    """(model, tokenizer) for a causal LM folder or alias, with an optional peft LoRA adapter.
    ``precision``: ``fp32 | bf16 | int8 | auto`` (:mod:`rag.models.precision`; int8 = int8 decode
    layers over the ``auto`` float weights). ``speed``: int8 decode layers / compiled forward,
    applied after the adapter is merged (:mod:`rag.generate.speed`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(name)
    dev = pick_device(device)
    speed = (speed or DecodeSpeed()).with_precision(
        check_precision(precision, "--decoder-precision")
    )
    speed.check(device=dev)
    dtype = torch_dtype(float_precision(precision, dev))
    with MODEL_LOAD_LOCK:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        if adapter is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(resolve_model(adapter)))
            # Fold the adapter into the weights for inference: an unmerged LoRA layer runs two
            # extra matmuls and a dtype cast per linear layer per token (a large share of the
            # decode time: docs/answering.md); the merged model answers the same.
            model = model.merge_and_unload()
    model.to(dev).eval()
    if str(dev).startswith("cpu"):  # prefill and scoring without copying the KV cache
        from rag.generate.gqa_attention import use_gqa_attention

        use_gqa_attention(model)
    model = speed.prepare(model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
