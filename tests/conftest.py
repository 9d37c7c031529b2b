"""Shared fixtures. Tiny models are trained once per session on a small in-repo corpus."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

from rag.storage.paths import shared_data_dir  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data``; tests that use it skip with a reason when it is absent."""
    path = shared_data_dir()
    if path is None:
        pytest.skip("../shared/data is absent (set RAG_SHARED_DATA to its location)")
    return path


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test: on a CPU shared with other jobs this is several times
    faster (``pytestmark = pytest.mark.usefixtures("one_torch_thread")``)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def chroma_server(tmp_path_factory):
    """URL of a Chroma server running from this venv on a free loopback port (``chroma run``),
    shared by the session: the index contract tests and the replica load test use it."""
    exe = Path(sys.executable).with_name("chroma")
    if not exe.exists():
        pytest.skip(f"{exe} not found (chromadb's CLI)")
    port = free_port()
    path = tmp_path_factory.mktemp("chroma_server")
    log = open(path.parent / "chroma_server.log", "wb")  # noqa: SIM115 (closed in teardown)
    proc = subprocess.Popen(
        [str(exe), "run", "--path", str(path), "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/api/v2/heartbeat", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"chroma server did not start (exit {proc.poll()}); see {log.name}")
        time.sleep(0.2)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def _session_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.getbasetemp() / "rag_home"
    home.mkdir(exist_ok=True)
    return home


@pytest.fixture(scope="session", autouse=True)
def _session_rag_home(tmp_path_factory):
    """Module and session fixtures (a decoder loaded once for a test file) write under the
    same temporary RAG_HOME as the tests: before, they ran before the per-test patch below and
    built the engine's folder of SmolLM2 in the checkout's artifacts/."""
    with _temporary_rag_home(_session_home(tmp_path_factory)):
        yield


@pytest.fixture(autouse=True)
def _isolated_rag_home(tmp_path_factory, monkeypatch):
    """Every test writes artefacts under a temporary RAG_HOME, never into the checkout."""
    monkeypatch.setenv("RAG_HOME", str(_session_home(tmp_path_factory)))
    yield


@pytest.fixture(autouse=True)
def _same_precision_on_every_cpu(monkeypatch):
    """``auto`` precision (the default of ingest, evals and the decoder) reads as fp32 in every
    test, so the suite computes the same numbers on a CPU with bf16 units (AMX) as on one without.
    Tests of ``auto`` itself patch ``cpu_has_bf16`` or the probe again."""
    import rag.models.precision

    monkeypatch.setattr(rag.models.precision, "cpu_has_bf16", lambda: False)


# ---------------------------------------------------------------------------- tiny from-scratch models
# A tokenizer and a tiny MLM encoder / CLM decoder trained in-process on tests/fixtures/corpus
# (a few seconds on one core). The folders load with AutoTokenizer / AutoModelForMaskedLM /
# AutoModelForCausalLM / SentenceTransformer, like the real artefacts of `make models`.

FIXTURE_CORPUS = REPO / "tests" / "fixtures" / "corpus"


class _temporary_rag_home:
    """Session fixtures run before the autouse RAG_HOME patch: point RAG_HOME at a temp dir
    while they build, so their corpus cache never lands in the checkout."""

    def __init__(self, path: Path):
        self.path, self.old = path, None

    def __enter__(self):
        self.old = os.environ.get("RAG_HOME")
        os.environ["RAG_HOME"] = str(self.path)

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop("RAG_HOME", None)
        else:
            os.environ["RAG_HOME"] = self.old


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory) -> Path:
    """Byte-level BPE tokenizer (vocab 1000) trained on tests/fixtures/corpus."""
    from training.tokenizer import train_tokenizer

    out = tmp_path_factory.mktemp("tiny_tokenizer")
    train_tokenizer([FIXTURE_CORPUS], vocab_size=1000, out=out)
    return out


def _tiny_pretrained(tmp_path_factory, tokenizer_dir: Path, objective: str) -> Path:
    from training.pretrain.config import PretrainConfig
    from training.pretrain.train import pretrain

    base = tmp_path_factory.mktemp(f"tiny_{objective}")
    cfg = PretrainConfig(
        objective=objective,
        preset="tiny",
        corpus=[str(FIXTURE_CORPUS)],
        out=str(base / "model"),
        tokenizer=str(tokenizer_dir),
        max_steps=40,
        seq_len=64,
        batch_size=8,
        eval_every=20,
        eval_batches=2,
        save_every=0,
        log_every=10,
        heldout_fraction=0.25,
        seed=0,
        device="cpu",
        threads=1,
    )
    with _temporary_rag_home(base / "rag_home"):
        pretrain(cfg, progress=False)
    return base / "model"


@pytest.fixture(scope="session")
def tiny_mlm_dir(tmp_path_factory, tiny_tokenizer_dir) -> Path:
    """Tiny ModernBertForMaskedLM folder (also a SentenceTransformer folder, mean pooling)."""
    return _tiny_pretrained(tmp_path_factory, tiny_tokenizer_dir, "mlm")


@pytest.fixture(scope="session")
def tiny_clm_dir(tmp_path_factory, tiny_tokenizer_dir) -> Path:
    """Tiny ModernBertDecoderForCausalLM folder with the chat template (eos = ``</s>``)."""
    return _tiny_pretrained(tmp_path_factory, tiny_tokenizer_dir, "clm")
