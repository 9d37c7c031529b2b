"""The in-place appending KV layer (rag.generate.kv_append): same logits, fewer copies.

A tiny random Llama (tests/generate_support.py), float32, weights 10x the usual init so a wrong
or missing cache column changes the logits.
"""

from __future__ import annotations

import pytest
import torch
from generate_support import build_model, build_tokenizer
from transformers import DynamicCache

from rag.generate.kv_append import AppendLayer, appending


@pytest.fixture(scope="module")
def model():
    return build_model("llama", build_tokenizer(), init=0.2)


def decode(model, cache, steps: int, rows: int = 2, reshape=None) -> torch.Tensor:
    """Greedy logits [1, steps + 1, V] of the last row: a 12-token prompt then ``steps``
    one-token steps; ``reshape(cache, step)`` may replace the cache's tensors between steps (as
    rows leaving do) and return the rows kept."""
    torch.manual_seed(1)
    ids = torch.randint(3, 200, (rows, 12))
    logits = []
    with torch.inference_mode():
        out = model(input_ids=ids, cache=cache, use_cache=True)
        for step in range(steps):
            logits.append(out.logits[-1:, -1])
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)  # [rows, 1]
            if reshape is not None:
                nxt = nxt[reshape(cache, step) or slice(None)]
            out = model(input_ids=nxt, cache=cache, use_cache=True)
        logits.append(out.logits[-1:, -1])
    return torch.stack(logits, dim=1)


def test_appending_layers_give_the_logits_of_concatenating_ones(model):
    cache = appending(DynamicCache(config=model.config))
    assert all(type(layer) is AppendLayer for layer in cache.layers)
    expected = decode(model, DynamicCache(config=model.config), steps=150)  # > 2 x spare
    assert torch.equal(decode(model, cache, steps=150), expected)
    assert cache.get_seq_length() == 12 + 150


def test_steps_write_into_spare_columns_without_copying(model):
    cache = appending(DynamicCache(config=model.config))
    layer = cache.layers[0]
    seen = []

    def watch(cache, step):
        seen.append(layer.keys.data_ptr())

    decode(model, cache, steps=AppendLayer.spare, reshape=watch)
    # the prompt's update allocated 12 + spare columns; every step after it wrote into them
    assert len(set(seen)) == 1
    assert layer._key_buf is not None and layer._key_buf.shape[2] == 12 + AppendLayer.spare
    assert layer.keys.shape[2] == 12 + AppendLayer.spare


def test_tensors_replaced_from_outside_start_a_new_buffer(model):
    """What the batched decoder does between steps: drop a row, trim leading columns."""

    def reshape(cache, step):
        if step == 3:
            cache.batch_select_indices(torch.tensor([1]))
            return [1]
        if step == 5:
            for layer in cache.layers:
                layer.keys, layer.values = layer.keys[:, :, 2:], layer.values[:, :, 2:]
        return None

    plain = decode(model, DynamicCache(config=model.config), steps=10, reshape=reshape)
    cache = appending(DynamicCache(config=model.config))
    assert torch.equal(decode(model, cache, steps=10, reshape=reshape), plain)
    assert cache.layers[0].keys.shape == (1, 2, 12 + 10 - 2, 16)


def test_adopt_keeps_the_layer_state_and_other_layer_types():
    cache = DynamicCache()
    k, v = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    cache.update(k, v, 0)
    sentinel = object()
    cache.layers.append(sentinel)
    appending(cache)
    assert type(cache.layers[0]) is AppendLayer and cache.layers[1] is sentinel
    assert cache.layers[0].keys is k or torch.equal(cache.layers[0].keys, k)
    keys, _ = cache.layers[0].update(k[:, :, :1], v[:, :, :1])
    assert torch.equal(keys, torch.cat([k, k[:, :, :1]], dim=2))


def test_rows_leaving_and_trims_keep_appending_in_place(model):
    """The batched decoder's ``_leave``: drop a row (one gather, spare columns kept), trim the
    leading columns (a view): the following steps still write into the same buffer."""
    storages = []

    def reshape(cache, step):
        layer = cache.layers[0]
        if step == 3:
            cache.batch_select_indices(torch.tensor([1]))
        if step == 4:
            for layer_ in cache.layers:
                layer_.keys, layer_.values = layer_.keys[:, :, 2:], layer_.values[:, :, 2:]
        storages.append(layer.keys.untyped_storage().data_ptr())
        return [1] if step == 3 else None

    plain = decode(model, DynamicCache(config=model.config), steps=10, reshape=reshape)
    storages.clear()
    cache = appending(DynamicCache(config=model.config))
    assert torch.equal(decode(model, cache, steps=10, reshape=reshape), plain)
    # one buffer before the row left, one after (the gather); the trim and the steps copy nothing
    assert len(set(storages[:3])) == 1 and len(set(storages[3:])) == 1
    assert storages[2] != storages[3]
