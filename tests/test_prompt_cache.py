"""The prompt cache (rag.generate.prompt_cache): prompts' keys and values reused by their longest
shared token prefix, exactly, on both decode paths.

The cache itself on hand-made tensors (lookup, bounds, eviction), then the invariant that
matters: a greedy answer started from a cached prompt, whole or in part, is the answer decoded
without any cache. Tiny sharp decoders in float32, as in tests/test_batching.py.
"""

from __future__ import annotations

import pytest
import torch
from generate_support import build_model, build_tokenizer
from test_batching import forwards, prefill_shapes, sharp_model, together

from rag.answer.prompt import build_messages
from rag.config import ConfigError, RAGConfig
from rag.generate.generator import Generator
from rag.generate.prompt_cache import PromptCache, common_prefix
from rag.generate.scoring import continuation_tree

PASSAGES = [
    "Use open() and iterate over the file object to read it line by line.",
    "The with statement closes the file when the block ends, even after an error.",
    "pathlib.Path.read_text reads a whole file into one string.",
]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def kv(n: int, layers: int = 2, fill: float = 0.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer keys and values [1, 2 heads, n, 4] whose entry at position p is fill + p."""
    pos = torch.arange(n, dtype=torch.float32)[None, None, :, None].expand(1, 2, n, 4)
    return [(pos + fill + i, -(pos + fill + i)) for i in range(layers)]


def cache_of(model_config_arch: str = "llama") -> PromptCache:
    from generate_support import model_config

    return PromptCache(model_config(model_config_arch, build_tokenizer()), max_bytes=10**6)


# ---- the cache on its own ---------------------------------------------------------------------


def test_common_prefix():
    a = torch.tensor([1, 2, 3, 4])
    assert common_prefix(a, torch.tensor([1, 2, 9])) == 2
    assert common_prefix(a, torch.tensor([1, 2])) == 2
    assert common_prefix(a, torch.tensor([7])) == 0
    assert common_prefix(a, a) == 4


def test_lookup_serves_the_longest_shared_prefix_as_a_private_copy():
    pc = cache_of()
    assert pc.lookup([1, 2, 3]) == (None, 0)  # empty
    assert pc.store([1, 2, 3, 4, 5], kv(5)) and pc.store([1, 2, 8, 9], kv(4, fill=100))
    cache, m = pc.lookup([1, 2, 3, 4, 7, 7])
    assert m == 4 and cache.get_seq_length() == 4
    assert torch.equal(cache.layers[1].keys, kv(5)[1][0][:, :, :4])  # the first entry's
    cache, m = pc.lookup([1, 2, 8, 9, 1])
    assert m == 4 and float(cache.layers[0].keys[0, 0, 0, 0]) == 100.0  # the second entry's
    # the whole of a stored prompt: all but its last token (its logits must be computed)
    cache, m = pc.lookup([1, 2, 3, 4, 5])
    assert m == 4
    # a request extending its copy leaves the stored entry as it was
    cache.layers[0].keys.fill_(-1.0)
    again, _ = pc.lookup([1, 2, 3, 4, 5])
    assert float(again.layers[0].keys[0, 0, 1, 0]) == 1.0
    # no more than the system prefix the caller already has: no hit
    assert pc.lookup([1, 2, 6], at_least=2) == (None, 0)
    s = pc.stats
    assert (s.lookups, s.hits, s.reused_tokens) == (6, 4, 16) and 0 < s.reused_share < 1


def test_store_keeps_only_the_prompt_positions_and_supersedes_prefixes():
    pc = cache_of()
    assert pc.store([1, 2, 3], kv(7))  # a decode cache: prompt + answer positions
    ((_, layers, size),) = pc._entries.values()
    assert layers[0][0].shape == (1, 2, 3, 4) and pc.bytes == size == 2 * 2 * 2 * 3 * 4 * 4
    assert not pc.store([1, 2], kv(2))  # held whole by [1, 2, 3]: not stored again
    assert not pc.store([1, 2, 3], kv(3))
    assert pc.store([1, 2, 3, 4], kv(4))  # extends [1, 2, 3], which is dropped for it
    assert list(pc._entries) == [(1, 2, 3, 4)] and pc.bytes == 2 * 2 * 2 * 4 * 4 * 4


def test_the_byte_budget_evicts_the_least_recently_used():
    per_token = 2 * 2 * 2 * 4 * 4  # layers x (k, v) x heads x head_dim x float32
    pc = PromptCache(cache_of().config, max_bytes=10 * per_token)
    assert pc.store([1, 1, 1, 1], kv(4)) and pc.store([2, 2, 2, 2], kv(4))
    pc.lookup([1, 1, 1, 1, 9])  # [1, ...] is now the most recently used
    assert pc.store([3, 3, 3, 3], kv(4))  # 12 tokens > 10: [2, ...] goes
    assert set(pc._entries) == {(1, 1, 1, 1), (3, 3, 3, 3)} and pc.bytes == 8 * per_token
    assert not pc.store(list(range(11)), kv(11))  # larger than the whole budget
    assert pc.bytes <= pc.max_bytes and len(pc) == 2
    assert not PromptCache(pc.config, 0).store([1], kv(1))  # 0 = off
    with pytest.raises(ValueError, match="prompt cache size"):
        PromptCache(pc.config, -1)


def test_only_full_attention_caches_are_supported(tok):
    assert PromptCache.supports(build_model("llama", tok))
    # ModernBERT-decoder's sliding-window layers cannot be cut at any position
    assert not PromptCache.supports(build_model("modernbert", tok))
    assert Generator(build_model("modernbert", tok), tok, "cpu", prompt_cache_mb=8).prompts is None


def test_config_refuses_a_negative_size():
    with pytest.raises(ConfigError, match="--prompt-cache-mb must be >= 0"):
        RAGConfig.of(prompt_cache_mb=-1)


# ---- exactness in the generator -----------------------------------------------------------------


def prompts(gen: Generator) -> list[tuple[list[int], int]]:
    """Prompts sharing more and more with the first: the same passages and another question,
    the first passage only, and none of its passages."""
    msgs = [
        build_messages("how do I read a file?", PASSAGES),
        build_messages("how do I read a file?", PASSAGES),  # repeated whole
        build_messages("what closes the file?", PASSAGES),  # same passages, new question
        build_messages("how do I read a file?", [PASSAGES[0], "Something else entirely."]),
        build_messages("why", ["Nothing shared here."]),
    ]
    return [gen.prompt_ids(m) for m in msgs]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_answers_from_cached_prompts_equal_uncached(tok, arch):
    model = sharp_model(arch, tok)
    gen = Generator(model, tok, "cpu", prompt_cache_mb=64)
    reqs = prompts(gen)
    expected = [gen.generate_ids(ids, p, max_new_tokens=16, use_cache=False) for ids, p in reqs]
    assert len(gen.prompts) == 0  # uncached calls store nothing
    reused = []
    for (ids, p), want in zip(reqs, expected, strict=True):
        stats: dict = {}
        assert gen.generate_ids(ids, p, max_new_tokens=16, stats=stats) == want
        reused.append(stats["cached_prefix_tokens"])
    system = reqs[0][1]
    first, repeated, same_passages, one_passage, other = reused
    assert first == system  # nothing stored yet: the system prefix
    assert repeated == len(reqs[1][0]) - 1  # all but the last token
    # its passages are new: only the system turn and the "Passages: [1]" header are shared
    assert system < other < one_passage < same_passages < repeated
    # the same, with the whole answer checked against plain generate's text
    msgs = build_messages("what closes the file?", PASSAGES)
    assert gen.generate(msgs, max_new_tokens=16) == gen.generate(
        msgs, max_new_tokens=16, use_prefix_cache=False
    )


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_batched_rows_start_from_cached_prompts_and_equal_alone(tok, arch):
    """Requests admitted together, each starting from what the prompt cache holds for it (a
    different length per row): one prefill forward over the uncached suffixes only, and every
    answer is the ids it gets alone without caches."""
    model = sharp_model(arch, tok)
    alone = Generator(model, tok, "cpu")
    batched = Generator(model, tok, "cpu", batching=True, max_batch=8, prompt_cache_mb=64)
    batched.batcher.prefill_forward_cost = 10**6  # all in one forward
    try:
        reqs = prompts(alone)
        expected = [
            alone.generate_ids(ids, p, max_new_tokens=12, use_cache=False) for ids, p in reqs
        ]
        # the first prompt decoded once, batched: its keys and values are kept from the batch
        assert batched.generate_ids(*reqs[0], max_new_tokens=12) == expected[0]
        assert len(batched.prompts) == 1
        starts = [batched.prompts.lookup(ids, at_least=p)[1] or p for ids, p in reqs]
        assert starts[1] == len(reqs[1][0]) - 1 and starts[-1] > reqs[-1][1]
        calls = [lambda r=r: batched.generate_ids(r[0], r[1], max_new_tokens=12) for r in reqs]
        with forwards(batched.model) as shapes:
            assert together(batched, calls) == expected
        longest = max(len(ids) - s for (ids, _), s in zip(reqs, starts, strict=True))
        assert prefill_shapes(shapes) == [(len(reqs), longest)]
        # the prompts the batch prefilled are kept too, from their rows of the padded batch
        for (ids, p), want in zip(reqs, expected, strict=True):
            again: dict = {}
            assert batched.generate_ids(ids, p, max_new_tokens=12, stats=again) == want
            assert again["cached_prefix_tokens"] == len(ids) - 1
        assert batched.prompts.bytes <= batched.prompts.max_bytes
    finally:
        batched.batcher.close()


@pytest.mark.parametrize("batching", [False, True])
def test_citation_scores_after_an_answer_run_none_of_it_again(tok, batching):
    """Citation completion scores `` [i]`` after the prompt and the answer just decoded. Either
    decode path keeps that prompt and answer in the prompt cache, so the scoring forward runs
    only the ids after what the cache holds (the answer's last id, where the text re-encodes to
    the decoded ids), never the prompt; the scores equal those computed with no cache at all."""
    model = sharp_model("llama", tok)
    plain = Generator(model, tok, "cpu", prefix_cache=False)
    gen = Generator(model, tok, "cpu", prompt_cache_mb=64, batching=batching, max_batch=4)
    try:
        msgs = build_messages("how do I read a file?", PASSAGES)
        ids, p = gen.prompt_ids(msgs)
        # a random model's bytes need not form text: ASCII tokens only, no lone leading space
        # (pipeline answers are stripped), as a real answer starts
        vocab = tok.convert_ids_to_tokens(list(range(len(tok))))
        odd = {i for i, t in enumerate(vocab) if t == "Ġ" or not t.removeprefix("Ġ").isascii()}
        ban = [[i] for i in sorted(odd | set(tok.all_special_ids))]
        new = gen.generate_ids(ids, p, max_new_tokens=8, ban=ban)
        answer = tok.decode(new, skip_special_tokens=True)
        answer_ids = tok(answer, add_special_tokens=False)["input_ids"]
        assert len(new) == 8 and answer_ids
        held = common_prefix(torch.tensor(answer_ids), torch.tensor(new[:-1]))
        assert held > 0  # the answer's own keys and values are there, not just the prompt's
        conts = [" [1]", " [2]", " [3]"]
        want = plain.score_continuations(msgs, answer, conts)
        with forwards(model) as shapes:
            got = gen.score_continuations(msgs, answer, conts)
        assert got == pytest.approx(want, abs=1e-4)
        # one forward: the ids after what the cache holds, then the markers' tree
        nodes = len(
            continuation_tree([tok(c, add_special_tokens=False)["input_ids"] for c in conts])[0]
        )
        assert shapes == [(1, max(1, len(answer_ids) - held) + nodes)]
    finally:
        if gen.batcher is not None:
            gen.batcher.close()


def test_clearing_forgets_prompts(tok):
    gen = Generator(sharp_model("llama", tok), tok, "cpu", prompt_cache_mb=64)
    ids, p = prompts(gen)[0]
    gen.generate_ids(ids, p, max_new_tokens=4)
    assert len(gen.prompts) == 1
    gen.clear_prefix_cache()
    assert len(gen.prompts) == 0 and gen.prompts.bytes == 0
    assert Generator(sharp_model("llama", tok), tok, "cpu").prompts is None  # off by default
