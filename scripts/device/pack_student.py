"""Carry a distilled causal-LM student off a machine that returns little: its trained tensors only.

`pack STUDENT TEACHER OUT` writes what the student does not share with its teacher (every tensor but the
token embeddings, which `distil-lm --freeze-embeddings` keeps as the teacher's) as float16, high and low
bytes apart and zlib-compressed, in PARTS files of under 16 MiB, and a manifest with the student's config,
its train_state.json and scores (lm_eval*.json) and checksums. `unpack OUT TEACHER STUDENT` rebuilds the HF
directory beside a copy of the same teacher. A 10-layer SmolLM2 student: 67.5 MiB of float16, ~58 MiB
packed. Used by scripts/device/smollm2_student.sh; numpy and safetensors only.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import zlib
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

EMBEDDINGS = "model.embed_tokens.weight"
MANIFEST = "student-pack.json"
SIDE_FILES = ("train_state.json", "lm_eval.json", "distill_report.json")
TEACHER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
)


def side_files(student: Path) -> list[Path]:
    """The run's own records: its state, and each score (lm_eval-SIZE.json per block size scored)."""
    named = [student / side for side in SIDE_FILES]
    return [path for path in named if path.exists()] + sorted(student.glob("lm_eval-*.json"))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pack(student: Path, teacher: Path, out: Path, parts: int = 5) -> dict[str, object]:
    weights = load_file(student / "model.safetensors")
    teacher_embeddings = load_file(teacher / "model.safetensors")[EMBEDDINGS]
    if not np.array_equal(weights[EMBEDDINGS], teacher_embeddings):
        raise SystemExit("the student's embeddings are not the teacher's: train with --freeze-embeddings")
    names = sorted(name for name in weights if name != EMBEDDINGS)
    largest = max(float(np.abs(weights[name]).max()) for name in names)
    if largest > 60000:
        raise SystemExit(f"a weight of {largest} does not fit float16")
    flat = np.concatenate([weights[name].astype(np.float16).ravel() for name in names])
    pairs = flat.view(np.uint8).reshape(-1, 2)
    high, low = zlib.compress(pairs[:, 1].tobytes(), 6), zlib.compress(pairs[:, 0].tobytes(), 6)
    stream = high + low
    out.mkdir(parents=True, exist_ok=True)
    size = -(-len(stream) // parts)
    files = []
    for i in range(parts):
        name = f"student.part{i}"
        (out / name).write_bytes(stream[i * size : (i + 1) * size])
        files.append(name)
    manifest = {
        "tensors": [[name, list(weights[name].shape)] for name in names],
        "high_bytes": len(high),
        "files": files,
        "float16_sha256": _sha(flat.tobytes()),
        "embeddings_sha256": _sha(teacher_embeddings.tobytes()),
        "config": json.loads((student / "config.json").read_text()),
        **{side.name: json.loads(side.read_text()) for side in side_files(student)},
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    mib = flat.nbytes / 2**20, len(stream) / 2**20
    print(f"packed {mib[0]:.1f} MiB of float16 into {mib[1]:.1f} MiB, {parts} files")
    return manifest


def unpack(packed: Path, teacher: Path, student: Path) -> None:
    manifest = json.loads((packed / MANIFEST).read_text())
    stream = b"".join((packed / name).read_bytes() for name in manifest["files"])
    high = np.frombuffer(zlib.decompress(stream[: manifest["high_bytes"]]), np.uint8)
    low = np.frombuffer(zlib.decompress(stream[manifest["high_bytes"] :]), np.uint8)
    flat = np.stack([low, high], axis=1).reshape(-1).view(np.float16)
    if _sha(flat.tobytes()) != manifest["float16_sha256"]:
        raise SystemExit("the packed tensors do not match their checksum")
    embeddings = load_file(teacher / "model.safetensors")[EMBEDDINGS]
    if _sha(embeddings.tobytes()) != manifest["embeddings_sha256"]:
        raise SystemExit(f"{teacher}'s embeddings are not the ones the student was trained with")
    weights, offset = {EMBEDDINGS: embeddings}, 0
    for name, shape in manifest["tensors"]:
        count = int(np.prod(shape))
        weights[name] = flat[offset : offset + count].astype(np.float32).reshape(shape)
        offset += count
    student.mkdir(parents=True, exist_ok=True)
    save_file(weights, student / "model.safetensors", metadata={"format": "pt"})
    (student / "config.json").write_text(json.dumps(manifest["config"], indent=2) + "\n")
    for side, data in manifest.items():
        if side.endswith(".json"):
            (student / side).write_text(json.dumps(data, indent=2) + "\n")
    for name in TEACHER_FILES:
        if (teacher / name).exists():
            shutil.copy(teacher / name, student / name)
    print(f"{student}: {len(weights)} tensors, embeddings from {teacher}")


if __name__ == "__main__":
    verb, *paths = sys.argv[1:]
    if verb == "pack" and len(paths) == 3:
        pack(*map(Path, paths))
    elif verb == "unpack" and len(paths) == 3:
        unpack(*map(Path, paths))
    else:
        raise SystemExit("usage: pack_student.py pack STUDENT TEACHER OUT | unpack OUT TEACHER STUDENT")
