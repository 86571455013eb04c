"""The chat template a text-generation export carries, and a way to add it to a version exported without.

`chat_spec(tokenizer)` is what export writes into the manifest (service.manifest.ChatTemplateSpec): the HF
tokenizer's Jinja template and the bos/eos tokens it may name. Versions exported before the manifest had the
field serve completions only; rather than re-export (minutes for a real model: SmolLM2-135M's fp32 graph
took ~5), `python -m export.chat HF_MODEL_DIR VERSION_DIR` adds the template of the HF directory the version
was exported from, after checking that its tokenizer.json is the one the version serves.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from common.cli import one_command_app, print_error
from common.provenance import sha256_of
from service.manifest import MANIFEST_FILE, ChatTemplateSpec, GenerationLayout, Manifest


def chat_spec(tokenizer: Any) -> ChatTemplateSpec | None:
    """The tokenizer's chat template, or None when it has none (a base model: completions only).

    A tokenizer with several named templates (a dict, e.g. "default" and "tool_use") gives its "default",
    the one `apply_chat_template` uses when no tools are passed."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    if not isinstance(template, str) or not template.strip():
        return None
    return ChatTemplateSpec(
        template=template,
        bos_token=_token_text(getattr(tokenizer, "bos_token", None)),
        eos_token=_token_text(getattr(tokenizer, "eos_token", None)),
    )


def _token_text(token: Any) -> str | None:
    """HF keeps special tokens as str or AddedToken; the template sees their text."""
    return None if token is None else str(token)


def _with_stop_token(layout: GenerationLayout, tokenizer: Any, token: str) -> GenerationLayout:
    """The layout, also stopping at the template's end-of-turn token (an older manifest knew only eos)."""
    token_id = tokenizer.convert_tokens_to_ids(token)
    if token_id is None or token_id == tokenizer.unk_token_id or token_id in layout.stop_ids():
        return layout
    eos = [] if layout.eos_token_id is None else [layout.eos_token_id]
    stops = list(dict.fromkeys([*eos, *layout.stop_token_ids, int(token_id)]))
    return layout.model_copy(update={"stop_token_ids": stops})


def add_chat_template(model_dir: Path, version_dir: Path) -> ChatTemplateSpec:
    """Write `model_dir`'s chat template into the manifest of an exported version (replaced atomically).

    Refused when the version's tokenizer is not the directory's (a template belongs to its tokenizer's
    special tokens), when the version is not a text-generation model, or when the directory has no
    template."""
    from transformers import AutoTokenizer

    manifest_path = version_dir / MANIFEST_FILE
    manifest = Manifest.model_validate_json(manifest_path.read_text(encoding="utf-8"))
    if manifest.task != "text-generation":
        raise ValueError(f"{version_dir} serves {manifest.task}; only text-generation models chat")
    source_tokenizer = model_dir / "tokenizer.json"
    if not source_tokenizer.is_file():
        raise ValueError(f"{model_dir} has no tokenizer.json")
    if sha256_of(source_tokenizer) != manifest.tokenizer.sha256:
        raise ValueError(
            f"{source_tokenizer} is not the tokenizer {version_dir} serves (sha256 differs): "
            "give the HF directory the version was exported from"
        )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    spec = chat_spec(tokenizer)
    if spec is None:
        raise ValueError(f"{model_dir}'s tokenizer has no chat template")
    update: dict[str, Any] = {"chat": spec}
    if manifest.generation is not None and spec.eos_token is not None:
        update["generation"] = _with_stop_token(manifest.generation, tokenizer, spec.eos_token)
    updated = manifest.model_copy(update=update)
    Manifest.model_validate(updated.model_dump())  # the whole contract still holds
    staging = manifest_path.with_name(f".{MANIFEST_FILE}.tmp")
    staging.write_text(json.dumps(updated.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")
    os.replace(staging, manifest_path)  # a reader sees the old manifest or the new one, never half
    return spec


def main(
    model_dir: Annotated[Path, typer.Argument(help="The HF model directory the version was exported from.")],
    version_dir: Annotated[Path, typer.Argument(help="The exported version, e.g. models/lm/3.")],
) -> None:
    """Add the HF directory's chat template to an exported text-generation version's manifest."""
    try:
        spec = add_chat_template(model_dir, version_dir)
    except (ValueError, OSError) as e:
        print_error(str(e))
        raise typer.Exit(1) from e
    print(f"{version_dir}: chat template added ({len(spec.template)} characters, eos {spec.eos_token!r})")


app = one_command_app(main)

if __name__ == "__main__":
    app()
