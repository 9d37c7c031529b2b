"""The saved folders load through every public path with exactly the trained weights."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread: on a CPU shared with other jobs this is several times faster."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _saved_tensors(folder):
    return load_file(str(folder / "model.safetensors"))


def test_tokenizer_loads_with_specials_and_chat_template(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    assert [tok.pad_token, tok.unk_token, tok.bos_token, tok.eos_token, tok.mask_token] == [
        "<pad>",
        "<unk>",
        "<s>",
        "</s>",
        "<mask>",
    ]
    assert tok.cls_token == tok.bos_token and tok.sep_token == tok.eos_token
    text = "def f(x):\n    return x  # naïve → ok"
    ids = tok(text).input_ids
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    assert tok.unk_token_id not in ids  # byte-level: nothing is unknown
    assert tok.decode(ids, skip_special_tokens=True) == text
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<s>user\nhi</s>\n<s>assistant\n"


@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_auto_model_loads_trained_weights(objective, tiny_mlm_dir, tiny_clm_dir):
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    folder = tiny_mlm_dir if objective == "mlm" else tiny_clm_dir
    cls = AutoModelForMaskedLM if objective == "mlm" else AutoModelForCausalLM
    model, info = cls.from_pretrained(str(folder), output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"]
    saved = _saved_tensors(folder)
    state = model.state_dict()
    for name, tensor in saved.items():
        assert torch.equal(state[name], tensor), name
    # the tied output projection really is the (trained) input embedding
    assert torch.equal(model.get_output_embeddings().weight, model.get_input_embeddings().weight)
    # the checkpoint (exactly what training ended with) agrees with the exported folder
    ckpt = torch.load(folder / "checkpoint" / "state.pt", weights_only=False)["model"]
    for name, tensor in saved.items():
        assert torch.equal(ckpt[name], tensor), name
    run = json.loads((folder / "run.json").read_text())
    assert run["status"] == "complete" and run["steps"] == 40


def test_sentence_transformer_uses_trained_encoder(tiny_mlm_dir):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(tiny_mlm_dir), device="cpu")
    saved = _saved_tensors(tiny_mlm_dir)
    inner = st[0].auto_model.state_dict()
    compared = 0
    for name, tensor in inner.items():
        key = "model." + name
        if key in saved:
            assert torch.equal(tensor, saved[key]), name
            compared += 1
    assert compared == len([k for k in saved if k.startswith("model.")])
    emb = st.encode(["git rebase rewrites commits", "a B-tree index"])
    assert emb.shape == (2, 64) and abs(float(emb[0] @ emb[1])) > 0


def test_decoder_generate_cache_equals_no_cache(tiny_clm_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_clm_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_clm_dir)).eval()
    ids = tok("The command git", return_tensors="pt").input_ids
    assert ids[0, -1] != tok.eos_token_id  # the decoder's tokenizer adds only <s>
    kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    cached = model.generate(ids, use_cache=True, **kw)
    uncached = model.generate(ids, use_cache=False, **kw)
    assert torch.equal(cached, uncached)
    assert cached.shape[1] > ids.shape[1]
