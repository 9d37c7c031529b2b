"""Every command line the README documents works as typed (issue 13's acceptance).

All of them are parsed by their own module's argument parser in a subprocess
(:mod:`readme_support`): a flag the README names that the parser lacks, a bad value or a missing
required argument fails here. The ones that can run on this machine are also run as subprocesses,
from a scratch folder with ``RAG_HOME`` inside it, at tiny sizes: arguments in :data:`RUNS` are
appended to the README's (argparse keeps a flag's last value), e.g. ``--max-steps 2``, or the
tiny encoder trained by the README's own first pretraining line instead of a released model.
Lines that need ``../shared/data`` or a decoder package skip with the reason when it is absent;
runs over 20 s here, and runs that repeat what another run checks (another output mode of
``rag.ask``, ``rag.search`` beside ``rag.ask``'s search, another backend or index folder: ~12 s
each on a 2-core AVX2 CPU, most of it imports), are marked slow (``make test-slow``). Servers (``rag.serve``, ``ui.app``), a Chroma server, Ray,
ONNX exports, multi-GPU ``torchrun``, the full-size corpus runs and the evals that need a built
index or a whole decoder run are parsed only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from readme_support import REPO, Command, readme_commands

COMMANDS = readme_commands()
BY_TEXT = {c.text: c for c in COMMANDS}
TIMEOUT = 600


@dataclass(frozen=True)
class Run:
    """How one README line is run for real here."""

    extra: tuple[str, ...] = ()  # appended to its arguments; {home}, {work} are filled in
    after: tuple[str, ...] = ()  # README lines whose artefacts it uses, run first
    data: bool = False  # reads ../shared/data
    models: tuple[str, ...] = ()  # model aliases that must resolve (decoder packages)
    slow: bool = False  # over 20 s here, or another run checks the same path (module docstring)


PRETRAIN_MLM = "python -m training.pretrain --objective mlm"
PRETRAIN_CLM = "python -m training.pretrain --objective clm --preset tiny --max-steps 20"
INGEST_DOCS = (
    "python -m rag.ingest docs/ --index docs --encoder encoder-mlm-small-contrastive"
    " --chunk-tokens 256 --overlap 32"
)
INGEST_ELSEWHERE = "python -m rag.ingest my-notes/ --index-dir /srv/indexes/notes --follow-links"
TINY_ENCODER = ("--encoder", "encoder-mlm-tiny")  # what PRETRAIN_MLM leaves in $RAG_HOME/models
ON_DOCS = ("--index", "docs", "--decoder", "decoder-clm-tiny", "--adapter", "none")
SHORT = ("--max-new-tokens", "8")
Q = '"how do I read a file line by line"'

RUNS: dict[str, Run] = {
    PRETRAIN_MLM: Run(extra=("--max-steps", "2", "--threads", "1")),
    PRETRAIN_CLM: Run(extra=("--threads", "1"), after=(PRETRAIN_MLM,)),
    INGEST_DOCS: Run(extra=TINY_ENCODER, after=(PRETRAIN_MLM,)),
    "python -m rag.ingest my-notes/ --index notes --backend chroma": Run(
        extra=TINY_ENCODER, after=(PRETRAIN_MLM,), slow=True
    ),
    INGEST_ELSEWHERE: Run(extra=TINY_ENCODER, after=(PRETRAIN_MLM,), slow=True),
    f"python -m rag.search {Q} --index pydocs --k 5 --mode hybrid --json": Run(
        extra=("--index", "docs"),
        after=(INGEST_DOCS,),
        slow=True,  # rag.ask --json searches
    ),
    f"python -m rag.search {Q} --index-dir /srv/indexes/notes": Run(
        after=(INGEST_ELSEWHERE,), slow=True
    ),
    f"python -m rag.ask {Q} --index pydocs": Run(
        extra=ON_DOCS + SHORT, after=(INGEST_DOCS, PRETRAIN_CLM), slow=True
    ),
    'python -m rag.ask "what does the with statement do" --index pydocs --stream': Run(
        extra=ON_DOCS + SHORT, after=(INGEST_DOCS, PRETRAIN_CLM), slow=True
    ),
    f"python -m rag.ask {Q} --index pydocs --json": Run(
        extra=ON_DOCS + SHORT, after=(INGEST_DOCS, PRETRAIN_CLM)
    ),
    'python -m rag.ask "how do I sort a list" --index pydocs --decoder smollm2 --adapter none': Run(
        extra=("--index", "docs", *SHORT),
        after=(INGEST_DOCS,),
        models=("smollm2",),
        slow=True,  # converts the GGUF into the scratch $RAG_HOME first
    ),
    "python -m evals.lm --model artifacts/models/decoder-clm-small"
    " --text ../shared/data/wikitext-2/wiki.valid.tokens": Run(
        extra=("--model", "{home}/models/decoder-clm-tiny", "--max-tokens", "256"),
        after=(PRETRAIN_CLM,),
        data=True,
    ),
    "python -m evals.retrieval --dataset squad:../shared/data/squad/squad-v1.1-dev-part.json"
    " --queries dev --retriever bm25": Run(extra=("--limit", "20"), data=True),
    "python -m rag.ingest ../shared/data/python-docs --index pydocs": Run(
        extra=TINY_ENCODER, after=(PRETRAIN_MLM,), data=True, slow=True
    ),
    "python -m training.finetune.contrastive --model encoder-mlm-small"
    " --out artifacts/models/encoder-mlm-small-contrastive"
    " --docs ../shared/data/python-docs ../shared/data/scifact/corpus.jsonl"
    " --scifact ../shared/data/scifact --squad ../shared/data/squad/squad-v1.1-dev-part.json"
    " --max-steps 60 --batch-size 32 --lr 2e-4 --max-seq-length 128 --threads 1": Run(
        extra=(
            "--model",
            "encoder-mlm-tiny",
            "--max-steps",
            "2",
            "--batch-size",
            "8",
            "--max-seq-length",
            "32",
            "--max-unsupervised",
            "64",
            "--max-pairs",
            "64",
            "--no-eval",
        ),  # fmt: skip
        after=(PRETRAIN_MLM,),
        data=True,
        slow=True,
    ),
    "python -m training.finetune.lora --model qwen2.5-coder-0.5b"
    " --out artifacts/models/qwen2.5-coder-0.5b-lora"
    " --data ../shared/data/squad/squad-v1.1-dev-part.json --docs ../shared/data/corpus/linux-doc"
    " --doc-fraction 0.2 --k-passages 5 --passage-words 50 --refusal-fraction 0.2"
    " --max-examples 360 --batch-size 1 --grad-accum 4 --lr 5e-4 --r 16 --alpha 32"
    " --top-layers 12 --no-eval --merge": Run(
        extra=("--max-examples", "4", "--max-steps", "1", "--grad-accum", "1", "--threads", "1"),
        data=True,
        models=("qwen2.5-coder-0.5b",),
        slow=True,
    ),
}


def _env(home: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env.update(
        PYTHONPATH=str(REPO),  # this checkout, whatever the venv has installed in editable mode
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
    )
    if home is not None:
        env["RAG_HOME"] = str(home)
    return env


# ---------------------------------------------------------------------------- parsing


def _ids(commands: list[Command]) -> list[str]:
    return [f"{i:02d} {c.module} {' '.join(c.args)}"[:90] for i, c in enumerate(commands)]


@pytest.fixture(scope="module")
def parsed(tmp_path_factory) -> dict[tuple[str, tuple[str, ...]], dict]:
    """{(module, args): result} for every README line, each RUNS line with its extra arguments
    and every module's ``--help``, from one driver subprocess in an empty folder."""
    work = tmp_path_factory.mktemp("readme_parse")
    jobs = {(c.module, c.args) for c in COMMANDS}
    jobs |= {_with_extra(t) for t in RUNS if t in BY_TEXT}
    jobs |= {(c.module, ("--help",)) for c in COMMANDS}
    jobs.add(BOGUS)
    jobs_list = sorted(jobs)
    out = work / "results.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "readme_support.py"), str(out)],
        input=json.dumps([[m, list(a)] for m, a in jobs_list]),
        capture_output=True,
        text=True,
        cwd=work,
        env=_env(work / "rag_home"),
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0 and out.exists(), proc.stderr[-3000:]
    return dict(zip(jobs_list, json.loads(out.read_text())))


BOGUS = ("rag.search", ("a question", "--index", "docs", "--no-such-flag"))


def test_a_flag_the_parser_lacks_fails(parsed):
    """What a README line naming a removed or renamed flag gets."""
    r = parsed[BOGUS]
    assert r["status"] == "exit" and r["code"] == 2
    assert "--no-such-flag" in r["stderr"]


def test_readme_lines_are_read_as_the_shell_reads_them(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        'text\n\n```bash\nC="a b"\n'
        "python -m m1 --x 1 \\\n    --y $C   # a comment\n"
        'K=v python -m m2 "..." --out ...\n'
        "python -m m3 --a 1 ...\n"
        "make demo\n```\n\n```toml\npython -m not_shell\n```\n"
    )
    c1, c2, c3 = readme_commands(readme)
    assert (c1.module, c1.args, c1.elided) == ("m1", ("--x", "1", "--y", "a", "b"), False)
    assert c1.text == "python -m m1 --x 1 --y $C"
    assert (c2.module, c2.args, c2.env, c2.elided) == ("m2", ("...", "--out", "PLACEHOLDER"), {"K": "v"}, True)  # fmt: skip
    assert (c3.args, c3.elided) == (("--a", "1"), True)


def test_readme_documents_the_commands():
    modules = {c.module for c in COMMANDS}
    assert len(COMMANDS) >= 30, [c.text for c in COMMANDS]
    for m in ("rag.ingest", "rag.search", "rag.ask", "rag.serve", "ui.app", "training.pretrain"):
        assert m in modules, m
    trainings = {"training.finetune.contrastive", "training.finetune.lora"}
    assert trainings | {"evals.retrieval", "evals.lm"} <= modules


def test_every_run_names_a_readme_line():
    """RUNS is keyed by the README's text: an edited line must be edited here too."""
    stale = [t for t in RUNS if t not in BY_TEXT]
    stale += [a for r in RUNS.values() for a in r.after if a not in RUNS]
    assert not stale, f"not (or no longer) in README.md: {stale}"


@pytest.mark.parametrize("command", COMMANDS, ids=_ids(COMMANDS))
def test_readme_command_parses(command, parsed):
    r = parsed[(command.module, command.args)]
    if r["status"] == "parsed":
        return
    missing = r["code"] == 2 and "the following arguments are required" in r["stderr"]
    if command.elided and missing:
        return  # the README writes `...` for the rest of the command
    pytest.fail(f"{command.text}\n-> {r['status']} {r['code']}: {r['stderr'].strip()}")


def _with_extra(text: str) -> tuple[str, tuple[str, ...]]:
    """(module, args) of a RUNS line with its appended arguments, placeholders filled with
    dummy folders (parsing never opens them)."""
    c = BY_TEXT[text]
    return c.module, c.args + _fill(RUNS[text].extra, Path("/HOME"), Path("/WORK"))


@pytest.mark.parametrize("text", sorted(t for t in RUNS if t in BY_TEXT))
def test_run_overrides_parse(text, parsed):
    """The arguments RUNS appends exist too (checked without running anything)."""
    r = parsed[_with_extra(text)]
    assert r["status"] == "parsed", f"{text} + {RUNS[text].extra}: {r['stderr'].strip()}"


@pytest.mark.parametrize("module", sorted({c.module for c in COMMANDS}))
def test_readme_module_has_help(module, parsed):
    r = parsed[(module, ("--help",))]
    assert r["status"] == "exit" and r["code"] == 0, r["stderr"]
    assert "usage:" in r["stdout"]


# ---------------------------------------------------------------------------- running


def _fill(args: tuple[str, ...], home: Path, work: Path) -> tuple[str, ...]:
    return tuple(a.format(home=home, work=work) for a in args)


class Workspace:
    """A scratch project folder (docs/ copied, my-notes/ with two notes), RAG_HOME inside it;
    runs README lines once each, their prerequisites first."""

    def __init__(self, root: Path):
        self.root, self.home = root, root / "rag_home"
        shutil.copytree(REPO / "docs", root / "docs")
        notes = root / "my-notes"
        notes.mkdir()
        (notes / "files.md").write_text(
            "# Files\n\n## Reading a file line by line\n\nOpen the file with open(path) and loop "
            "over it: each iteration yields one line, newline included.\n"
        )
        (notes / "git.md").write_text(
            "# Git\n\n## Branches\n\ngit switch -c NAME creates a branch and switches to it.\n"
        )
        self.done: dict[str, subprocess.CompletedProcess] = {}

    def args(self, command: Command, run: Run) -> list[str]:
        from rag.storage.paths import shared_data_dir

        shared = shared_data_dir()
        subst = {
            "my-notes/": str(self.root / "my-notes"),
            "/srv/indexes/notes": str(self.root / "elsewhere" / "notes"),
        }
        out = []
        for a in (*command.args, *_fill(run.extra, self.home, self.root)):
            a = subst.get(a, a)
            if "../shared/data" in a and shared is not None:
                a = a.replace("../shared/data", str(shared))
            out.append(a)
        return out

    def run(self, text: str) -> subprocess.CompletedProcess:
        if text in self.done:
            return self.done[text]
        run, command = RUNS[text], BY_TEXT[text]
        for before in run.after:
            prior = self.run(before)
            assert prior.returncode == 0, f"{before} (needed first) failed:\n{prior.stderr[-3000:]}"
        env = {**_env(self.home), **command.env}
        self.done[text] = subprocess.run(
            [sys.executable, "-m", command.module, *self.args(command, run)],
            capture_output=True,
            text=True,
            cwd=self.root,
            env=env,
            timeout=TIMEOUT,
        )
        return self.done[text]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("readme_run"))


def _needs(run: Run) -> str | None:
    """Why this run cannot happen here, or None. Decoder packages are looked up, not converted
    (the run converts them into its own $RAG_HOME)."""
    from rag.models import GGUF_PACKAGES, ModelNotFoundError, resolve_model, smollm2_gguf_path
    from rag.models.gguf import MissingPartError, part_paths
    from rag.storage.paths import shared_data_dir

    if run.data and shared_data_dir() is None:
        return "../shared/data is absent (set RAG_SHARED_DATA to its location)"
    for alias in run.models:
        try:
            if alias == "smollm2":
                smollm2_gguf_path()
            elif alias in GGUF_PACKAGES:
                part_paths(GGUF_PACKAGES[alias])
            else:
                resolve_model(alias)
        except (ModelNotFoundError, MissingPartError, OSError) as e:
            return f"model {alias!r} is not installed: {str(e).splitlines()[0]}"
    return None


def _run_params():
    for text, run in RUNS.items():
        marks = [pytest.mark.slow] if run.slow else []
        if run.data:
            marks.append(pytest.mark.data)
        yield pytest.param(text, marks=marks, id=text[10:80])


@pytest.mark.parametrize("text", list(_run_params()))
def test_readme_command_runs(text, workspace):
    run = RUNS[text]
    for t in (text, *run.after):
        if reason := _needs(RUNS[t]):
            pytest.skip(reason)
    proc = workspace.run(text)
    assert proc.returncode == 0, (
        f"{text}\nstdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-4000:]}"
    )


def test_pretraining_as_typed_leaves_hf_loadable_models(workspace):
    """The two first pretraining lines of the README: no corpus, tokenizer or --out given."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

    for text in (PRETRAIN_MLM, PRETRAIN_CLM):
        proc = workspace.run(text)
        assert proc.returncode == 0, proc.stderr[-4000:]
    models = workspace.home / "models"
    AutoModelForMaskedLM.from_pretrained(models / "encoder-mlm-tiny")
    AutoModelForCausalLM.from_pretrained(models / "decoder-clm-tiny")
    AutoTokenizer.from_pretrained(models / "decoder-clm-tiny")
