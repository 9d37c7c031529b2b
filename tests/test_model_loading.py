"""Model loads hold one process-wide lock (rag.models.loading): transformers' from_pretrained swaps
process-wide attributes while loading, so concurrent loads in request threads could leave a model
untied (LM head on the meta device) — the suite saw it once."""

from __future__ import annotations

import threading

import torch
from generate_support import save_tiny_llama
from transformers import AutoModelForCausalLM

from rag.generate.load import load_generator
from rag.models.loading import MODEL_LOAD_LOCK


def test_a_decoder_load_holds_the_lock(monkeypatch, tmp_path):
    folder = save_tiny_llama(tmp_path / "m")
    real = AutoModelForCausalLM.from_pretrained
    free_elsewhere = []

    def spy(*args, **kwargs):
        def probe():
            got = MODEL_LOAD_LOCK.acquire(blocking=False)
            free_elsewhere.append(got)
            if got:
                MODEL_LOAD_LOCK.release()

        t = threading.Thread(target=probe)
        t.start()
        t.join()
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    load_generator(str(folder))
    assert free_elsewhere == [False]  # another thread could not take it mid-load


def test_concurrent_loads_give_identical_tied_models(tmp_path):
    folder = save_tiny_llama(tmp_path / "m")
    reference, _ = load_generator(str(folder))
    models, errors = [], []

    def load():
        try:
            models.append(load_generator(str(folder))[0])
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(models) == 4
    ids = torch.tensor([[1, 5, 9, 13]])
    with torch.no_grad():
        want = reference(ids).logits
        for m in models:
            assert not any(p.is_meta for p in m.parameters())
            assert torch.equal(m(ids).logits, want)
