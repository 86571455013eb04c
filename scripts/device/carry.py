"""Carry files larger than one call takes onto a lent machine, over several calls on the warm machine.

A `device` call sends at most 64 MiB with the working tree, so a GGUF teacher (94 MiB) or the wheels the
service needs there (onnxruntime-gpu alone is 244 MiB) go in parts, one a call, each checked as it lands and
the whole checked once the last does:

    python scripts/device/carry.py split FILE... --out build/device-carry      # here: call1/, call2/, ...
    python3 scripts/device/carry.py join build/device-carry/callK /tmp/carried  # there, call K carrying callK

`join` keeps each part under STAGE and says how many of how many it holds; with every part there it
rebuilds the bundle, checks it and unpacks the files into STAGE/files (and writes STAGE/complete). A part
that lands twice is the same part; one that does not match its checksum is refused. Standard library only:
the machine's own Python runs it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tarfile
from pathlib import Path

MANIFEST = "carry.json"
CHUNK = 1 << 20


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def split(files: list[Path], out: Path, part_mib: float = 50) -> dict[str, object]:
    """Bundle FILES (by their names) into one tar, cut into parts of PART_MIB, one folder per call."""
    names = [f.name for f in files]
    if len(set(names)) != len(names):
        raise SystemExit("two files share a name: the bundle keeps names only")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    bundle = out / "bundle.tar"
    with tarfile.open(bundle, "w") as tar:
        for f in files:
            tar.add(f, arcname=f.name)
    part_bytes, size = int(part_mib * 2**20), bundle.stat().st_size
    count = max(1, -(-size // part_bytes))
    part_sha = []
    with bundle.open("rb") as source:
        for i in range(count):
            call = out / f"call{i + 1}"
            call.mkdir()
            part = call / f"bundle.part{i + 1}"
            with part.open("wb") as sink:
                left = part_bytes
                while left and (block := source.read(min(CHUNK, left))):
                    sink.write(block)
                    left -= len(block)
            part_sha.append(_sha256(part))
    manifest = {
        "parts": count,
        "bytes": size,
        "sha256": _sha256(bundle),
        "part_sha256": part_sha,
        "files": names,
    }
    bundle.unlink()
    for i in range(count):
        (out / f"call{i + 1}" / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{len(files)} files, {size / 2**20:.1f} MiB, in {count} parts: carry {out}/call1 ... call{count}")
    return manifest


def join(part_dir: Path, stage: Path) -> bool:
    """Keep the part in PART_DIR under STAGE; with all parts there, unpack the files. True once complete."""
    manifest = json.loads((part_dir / MANIFEST).read_text())
    parts_dir = stage / "parts"
    parts_dir.mkdir(parents=True, exist_ok=True)
    known = stage / MANIFEST
    if known.exists() and json.loads(known.read_text())["sha256"] != manifest["sha256"]:
        raise SystemExit(f"{stage} holds parts of another bundle: use a new stage folder")
    known.write_text(json.dumps(manifest, indent=1) + "\n")
    for part in part_dir.glob("bundle.part*"):
        index = int(part.name.removeprefix("bundle.part"))
        if _sha256(part) != manifest["part_sha256"][index - 1]:
            raise SystemExit(f"{part} does not match its checksum: carry it again")
        shutil.copyfile(part, parts_dir / part.name)
    held = [i for i in range(1, manifest["parts"] + 1) if (parts_dir / f"bundle.part{i}").exists()]
    missing = sorted(set(range(1, manifest["parts"] + 1)) - set(held))
    if missing:
        still = ", ".join(f"call{i}" for i in missing)
        print(f"{stage}: {len(held)} of {manifest['parts']} parts; still to carry: {still}")
        return False
    bundle = stage / "bundle.tar"
    with bundle.open("wb") as sink:
        for i in held:
            with (parts_dir / f"bundle.part{i}").open("rb") as source:
                shutil.copyfileobj(source, sink, CHUNK)
    if _sha256(bundle) != manifest["sha256"]:
        raise SystemExit(f"{bundle} does not match its checksum although every part did")
    with tarfile.open(bundle) as tar:
        tar.extractall(stage / "files", filter="data")
    bundle.unlink()
    shutil.rmtree(parts_dir)
    (stage / "complete").write_text("\n".join(manifest["files"]) + "\n")
    print(f"{stage}/files: {len(manifest['files'])} files, {manifest['bytes'] / 2**20:.1f} MiB, checked")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    cut = verbs.add_parser("split", help="bundle files into call-sized parts (here)")
    cut.add_argument("files", nargs="+", type=Path)
    cut.add_argument("--out", type=Path, required=True)
    cut.add_argument("--part-mib", type=float, default=50, help="each part's size (50: room for the tree)")
    land = verbs.add_parser("join", help="keep one part; unpack once all are there (on the machine)")
    land.add_argument("part_dir", type=Path)
    land.add_argument("stage", type=Path)
    args = parser.parse_args(argv)
    if args.verb == "split":
        split(args.files, args.out, args.part_mib)
    else:
        join(args.part_dir, args.stage)
    return 0


if __name__ == "__main__":
    sys.exit(main())
