"""``rag.ingest --engine ray``: Ray Data reads and chunks the new/changed files, ``map_batches``
embeds the chunks in N encoder actors, and the driver publishes the result through the same
path as the local engine (:mod:`rag.ingest.apply`: manifest, one atomic generation, incremental
re-ingest, delete propagation, bad-file report).

Why only these two steps move: the encoder pass is most of an ingest, and chunking needs the
file bytes, so both belong near the workers; classifying files (stat, hash, manifest lookup),
BM25 and publication are cheap, need the whole index, and must stay in one process that holds
the index lock. The driver therefore still collects every chunk and vector (see
docs/scaling.md for where that stops scaling).

Workers must import this package and read the model and documents at the same paths as the
driver: true on a local cluster; on a multi-node cluster install the project (with the ``ray``
extra) on every node and put documents and models on shared storage.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rag.documents.chunking import indexed_text
from rag.ingest.config import IngestConfig
from rag.ingest.plan import EncoderHandle, PendingFile, chunk_file, os_reason
from rag.storage.paths import rag_home
from rag.types import Chunk

BATCH_SIZE = 256  # chunks per map_batches call; the encoder re-batches them by token length
_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])
log = logging.getLogger("rag.ingest")


def machine_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; ``os.cpu_count()`` without one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def local_cluster_cpus(workers: int, machine: int) -> int:
    """Logical CPUs a local cluster of this run declares: the machine's, or ``workers + 1`` (one
    per encoder actor, one for chunking) when that is more. Ray schedules by this logical count
    and never pins a task to a core, so on a 2-core machine ``--workers 2`` runs its two actors
    and the chunking task on the two cores (each actor with one torch thread) instead of
    refusing; the price is that they share the cores."""
    return max(machine, workers + 1)


def _chunk_row(row: dict[str, Any], tokenizer: Any, chunking: dict, limits: Any) -> list[dict]:
    """Ray Data ``flat_map``: one file in, its chunks out (or one row carrying the failure)."""
    from rag.documents import DocumentError, failure_reason

    key = row["key"]
    try:
        chunks = chunk_file(Path(key), key, tokenizer, chunking, limits)
    except DocumentError as e:
        return [{"key": key, "pos": 0, "error": e.reason, "chunk": "", "text": ""}]
    except OSError as e:
        return [{"key": key, "pos": 0, "error": os_reason(e, Path(key)), "chunk": "", "text": ""}]
    except Exception as e:  # noqa: BLE001 - one file's failure, never the run's
        return [{"key": key, "pos": 0, "error": failure_reason(e), "chunk": "", "text": ""}]
    return [
        {
            "key": key,
            "pos": i,
            "error": "",
            "chunk": json.dumps(c.to_dict()),
            "text": indexed_text(c, chunking.get("context", 0)),
        }
        for i, c in enumerate(chunks)
    ]


def use_cluster_token(env: dict[str, str] | None = None, home: Path | None = None) -> bool:
    """Set ``RAY_AUTH_MODE=token`` for a driver joining a running cluster when a Ray token is at
    hand (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``) and the user set
    no mode. Why: ``ray start`` (Ray >= 2.5x) enables token authentication and writes the token,
    but ``ray.init(address=...)`` still defaults to no authentication and is refused
    ("InvalidAuthToken"); a token-mode client also joins a cluster without authentication
    (checked on Ray 2.60). Ray reads the mode when it is first imported, so this runs before.
    Returns whether it set the mode."""
    env = os.environ if env is None else env
    if env.get("RAY_AUTH_MODE"):
        return False
    home = Path.home() if home is None else home
    token = env.get("RAY_AUTH_TOKEN") or env.get("RAY_AUTH_TOKEN_PATH")
    if not token and not (home / ".ray" / "auth_token").is_file():
        return False
    env["RAY_AUTH_MODE"] = "token"
    return True


class EmbedActor:
    """A Ray Data actor holding one encoder. It refuses to start when its weights are not the
    driver's (a worker node with another copy of the model would corrupt the index)."""

    def __init__(self, name: str, device: str, precision: str, backend: str, fingerprint: str):
        from rag.retrieval.encoder import Encoder

        self.encoder = Encoder.load(name, device=device, precision=precision, backend=backend)
        if self.encoder.fingerprint != fingerprint:
            raise RuntimeError(
                f"worker encoder {name!r} has weights {self.encoder.fingerprint}, "
                f"the driver's {fingerprint}: every node must have the same model files"
            )

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = [str(t) for t in batch["text"]]
        keep = [i for i, e in enumerate(batch["error"]) if not e]
        vectors = np.zeros((len(texts), self.encoder.dim), dtype=np.float32)
        if keep:
            vectors[keep] = self.encoder.encode([texts[i] for i in keep])
        batch["vector"] = vectors
        return batch


class RayEngine:
    """Chunks and embeds through Ray (see module docstring). Ray starts only when something is
    to be chunked or embedded, so an unchanged re-ingest never touches the cluster."""

    def __init__(
        self,
        cfg: IngestConfig,
        encoder: EncoderHandle,
        on_batch: Callable[[int], None] | None = None,
        notes: list[str] | None = None,
    ):
        self.cfg, self.encoder, self.on_batch = cfg, encoder, on_batch
        self.notes = [] if notes is None else notes  # the report's notes: what Ray was given
        self.vectors: dict[str, np.ndarray] = {}  # chunk id -> vector, from the chunking pass
        self.timings: dict[str, float] = {}
        self._started = False

    # ------------------------------------------------------------------ cluster

    def _env(self) -> dict[str, str]:
        """What the workers need from the driver's environment: this package on the path,
        the same artefact folder (the ONNX export cache), no hub access."""
        path = os.pathsep.join(p for p in (_PROJECT_ROOT, os.environ.get("PYTHONPATH")) if p)
        env = {
            "PYTHONPATH": path,
            "RAG_HOME": str(rag_home()),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        return env

    def _ray(self) -> Any:
        """Ray, connected: to ``--ray-address`` (or ``$RAY_ADDRESS``) when given, else to a
        local cluster this run starts with enough logical CPUs for ``--workers``
        (:func:`local_cluster_cpus`); a cluster given by address, or one the caller started,
        must have them already."""
        import sys

        address = self.cfg.ray_address or os.environ.get("RAY_ADDRESS")
        if address and "ray" not in sys.modules:
            use_cluster_token()  # read once, when ray is first imported
        import ray

        if not ray.is_initialized():
            where: dict[str, Any] = {"address": address}
            if not address:  # "local": a new cluster even if `ray start` left one running
                machine = machine_cpus()
                cpus = local_cluster_cpus(self.cfg.workers, machine)
                where = {"address": "local", "num_cpus": cpus}
                if cpus > machine:
                    note = (
                        f"ray: started a local cluster with {cpus} logical CPUs for --workers "
                        f"{self.cfg.workers} (one per encoder actor, one for chunking) on "
                        f"{machine} cores; they share the cores"
                    )
                    log.info(note)
                    self.notes.append(note)
            ray.init(
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,  # the ingest's own report is the output
                runtime_env={"env_vars": self._env()},
                **where,
            )
            self._started = True
        from ray.data import DataContext

        ctx = DataContext.get_current()
        ctx.enable_progress_bars = self.cfg.progress
        ctx.print_on_execution_start = False
        cpus = ray.cluster_resources().get("CPU", 0)
        if cpus < self.cfg.workers + 1:
            raise ValueError(
                f"--workers {self.cfg.workers} needs at least {self.cfg.workers + 1} CPUs in the "
                f"Ray cluster (one per encoder actor, one for chunking); it has {cpus:g}"
            )
        return ray

    def close(self) -> None:
        """Shut Ray down if this run started it (a cluster given by address, or one the caller
        started, is left running)."""
        if self._started:
            import ray

            ray.shutdown()
            self._started = False

    # ------------------------------------------------------------------ pipeline

    def _embed(self, ds: Any) -> Any:
        from ray.data import ActorPoolStrategy

        from rag.models import pick_device

        enc = self.encoder.get()
        device = "cpu" if self.cfg.encoder_backend == "onnx" else pick_device(self.cfg.device)
        return ds.map_batches(
            EmbedActor,
            fn_constructor_kwargs={
                "name": str(enc.path or enc.name),
                "device": device,
                "precision": self.cfg.precision,
                "backend": self.cfg.encoder_backend,
                "fingerprint": enc.fingerprint,
            },
            compute=ActorPoolStrategy(size=self.cfg.workers),
            batch_size=BATCH_SIZE,
            batch_format="numpy",
            num_cpus=1,
            num_gpus=1 if device == "cuda" else 0,
            runtime_env={"env_vars": self._env()},
        )

    def _collect(self, ds: Any) -> list[dict[str, Any]]:
        """The pipeline's rows; off a terminal a progress line counts them (the total is not
        known while Ray streams; on a terminal Ray Data draws its own bars)."""
        from rag.cli.progress import Progress

        rows: list[dict[str, Any]] = []
        with Progress(None, "ray chunk+embed", "chunk", enabled=self.cfg.progress, bar=False) as p:
            for batch in ds.iter_batches(batch_format="numpy", batch_size=BATCH_SIZE):
                n = len(batch["key"])
                rows.extend({k: batch[k][i] for k in batch} for i in range(n))
                p.update(n)
                if self.on_batch is not None:
                    self.on_batch(n)
        return rows

    def chunk(self, files: list[PendingFile], chunking: dict) -> dict[str, list[Chunk] | str]:
        """Chunk and embed ``files`` in one streaming Ray Data pipeline; the vectors are kept
        for :meth:`encode`. Returns each file's chunks (in document order) or failure reason."""
        t0 = time.perf_counter()
        ray = self._ray()
        ds = ray.data.from_items([{"key": f.key} for f in files])
        ds = ds.flat_map(
            _chunk_row,
            fn_kwargs={
                "tokenizer": self.encoder.get().tokenizer,
                "chunking": dict(chunking),
                "limits": self.cfg.limits(),
            },
            num_cpus=1,
            runtime_env={"env_vars": self._env()},
        )
        out: dict[str, list[Chunk] | str] = {}
        order: dict[str, int] = {}  # chunk id -> position in its document (rows come unordered)
        for row in self._collect(self._embed(ds)):
            key = str(row["key"])
            if row["error"]:
                out[key] = str(row["error"])
                continue
            d = json.loads(str(row["chunk"]))
            chunk = Chunk(**{**d, "heading_path": tuple(d.get("heading_path", ()))})
            order[chunk.id] = int(row["pos"])
            got = out.setdefault(key, [])
            if isinstance(got, list):
                got.append(chunk)
            self.vectors[chunk.id] = np.asarray(row["vector"], dtype=np.float32)
        for got in out.values():
            if isinstance(got, list):
                got.sort(key=lambda c: order[c.id])
        self.timings["ray_chunk_embed"] = time.perf_counter() - t0
        return out

    def encode(self, chunks: list[Chunk]) -> np.ndarray:
        """Vectors for ``chunks`` in order: those embedded by :meth:`chunk`, plus any others
        (chunks a Chroma collection lost in a crash) embedded now by the same actors."""
        rest = [c for c in chunks if c.id not in self.vectors]
        if rest:
            ray = self._ray()
            items = [
                {
                    "key": c.id,
                    "pos": 0,
                    "error": "",
                    "chunk": "",
                    "text": indexed_text(c, self.cfg.context),
                }
                for c in rest
            ]
            for row in self._collect(self._embed(ray.data.from_items(items))):
                self.vectors[str(row["key"])] = np.asarray(row["vector"], dtype=np.float32)
        dim = self.encoder.identity()["dim"]
        out = np.zeros((len(chunks), dim), dtype=np.float32)
        for i, c in enumerate(chunks):
            out[i] = self.vectors[c.id]
        return out
