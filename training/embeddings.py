"""Sentence embeddings: an HF encoder, a pooling rule and an optional projection, kept as a
sentence-transformers directory.

Why a pooling rule and not a head: an embedding model is the encoder plus how its token vectors become one
sentence vector. all-MiniLM-L6-v2 averages the real (attention-mask 1) tokens, then L2-normalises; other
models take [CLS] or a max. sentence-transformers writes that rule beside the HF files (`modules.json`,
`1_Pooling/config.json`, a `Normalize` entry), so reading it from there is how a teacher says how it embeds,
and writing it the same way lets export/ (and sentence-transformers itself) read a student without guessing.

An HF directory without those files gets the MiniLM rule: mean over real tokens, then normalise.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple, cast

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModel, PreTrainedModel, PreTrainedTokenizerBase

PoolingMode = Literal["mean", "cls", "max"]
POOLING_MODES: tuple[PoolingMode, ...] = ("mean", "cls", "max")

MODULES = "modules.json"
ST_CONFIG = "sentence_bert_config.json"
_ST = "sentence_transformers.models."
# sentence-transformers' Pooling config flags, ours first; the others are written False so newer versions
# read the file without guessing and a directory asking for them is refused rather than misread.
_MODE_FLAGS: dict[str, PoolingMode | None] = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": None,
    "pooling_mode_weightedmean_tokens": None,
    "pooling_mode_lasttoken": None,
}
_IDENTITY = "torch.nn.modules.linear.Identity"  # the Dense activation we write and accept


@dataclass(frozen=True)
class Pooling:
    """How token vectors become one sentence vector: `mode` over the real tokens, then (optionally) L2."""

    mode: PoolingMode = "mean"
    normalize: bool = True


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: PoolingMode) -> torch.Tensor:
    """[B, L, H] token vectors and a [B, L] mask -> [B, H], padding never counted (sentence-transformers'
    arithmetic: mean divides by the real-token count clamped at 1e-9, max sees padding as -1e9)."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "mean":
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        return hidden.masked_fill(mask == 0, -1e9).max(1).values
    raise ValueError(f"pooling mode must be one of {', '.join(POOLING_MODES)}, got {mode!r}")


class SentenceOutput(NamedTuple):
    embedding: torch.Tensor  # [B, D]: pooled, projected, normalised as the rule says
    hidden_states: tuple[torch.Tensor, ...] | None = None  # the encoder's, when asked for (alignment)


class SentenceEncoder(nn.Module):
    """backbone -> pooling -> optional linear projection -> optional L2 normalisation.

    The projection lets a student narrower than its teacher produce embeddings of the teacher's width
    (sentence-transformers' Dense module, identity activation). `max_length` is the truncation the model
    was trained with (sentence-transformers' max_seq_length).
    """

    def __init__(
        self,
        backbone: PreTrainedModel,
        pooling: Pooling = Pooling(),
        projection: nn.Linear | None = None,
        max_length: int | None = None,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.pooling = pooling
        self.projection = projection
        self.max_length = max_length or int(backbone.config.max_position_embeddings)

    @property
    def dim(self) -> int:
        """The embedding width clients get."""
        return self.projection.out_features if self.projection is not None else self.width

    @property
    def width(self) -> int:
        """The encoder's hidden size."""
        return int(self.backbone.config.hidden_size)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> SentenceOutput:
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        out = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            output_hidden_states=output_hidden_states,
            **extra,
        )
        embedding = pool(out.last_hidden_state, attention_mask, self.pooling.mode)
        if self.projection is not None:
            embedding = self.projection(embedding)
        if self.pooling.normalize:
            embedding = F.normalize(embedding, p=2, dim=-1)
        return SentenceOutput(embedding, out.hidden_states if output_hidden_states else None)

    # ----------------------------------------------------------------------- files

    def save(self, out_dir: str | Path) -> Path:
        """The HF files plus sentence-transformers' modules: Transformer, Pooling, [Dense], [Normalize]."""
        out = Path(out_dir)
        self.backbone.save_pretrained(out)
        modules: list[dict[str, Any]] = [{"path": "", "type": _ST + "Transformer"}]
        modules.append({"path": "1_Pooling", "type": _ST + "Pooling"})
        flags = {flag: mode == self.pooling.mode for flag, mode in _MODE_FLAGS.items()}
        _write_json(out / "1_Pooling" / "config.json", {"word_embedding_dimension": self.width, **flags})
        if self.projection is not None:
            dense = f"{len(modules)}_Dense"
            modules.append({"path": dense, "type": _ST + "Dense"})
            _write_json(
                out / dense / "config.json",
                {
                    "in_features": self.projection.in_features,
                    "out_features": self.projection.out_features,
                    "bias": self.projection.bias is not None,
                    "activation_function": _IDENTITY,
                },
            )
            weights = {
                f"linear.{k}": v.detach().cpu().contiguous() for k, v in self.projection.state_dict().items()
            }
            save_file(weights, str(out / dense / "model.safetensors"))
        if self.pooling.normalize:
            normalize = f"{len(modules)}_Normalize"
            modules.append({"path": normalize, "type": _ST + "Normalize"})
            (out / normalize).mkdir(exist_ok=True)  # no files: Normalize has no parameters
        entries = [{"idx": i, "name": str(i), **entry} for i, entry in enumerate(modules)]
        _write_json(out / MODULES, entries)
        _write_json(out / ST_CONFIG, {"max_seq_length": self.max_length, "do_lower_case": False})
        return out

    @classmethod
    def load(cls, model_dir: str | Path, pooling: Pooling | None = None) -> SentenceEncoder:
        """An encoder directory with the pooling rule (and projection, max length) its files name; `pooling`
        is for a plain HF directory that names none (default: mean, then normalise)."""
        path = Path(model_dir)
        config = AutoConfig.from_pretrained(path)
        attention = {"attn_implementation": "eager"} if _relative_positions(config) else {}
        backbone = AutoModel.from_pretrained(path, **attention)
        rule = read_pooling(path)
        if rule is None:
            rule = pooling or Pooling()
        elif pooling is not None and pooling != rule:
            raise ValueError(f"{path} pools {_describe(rule)}; it cannot be read as {_describe(pooling)}")
        return cls(backbone, rule, read_projection(path), read_max_length(path))


def read_pooling(model_dir: str | Path) -> Pooling | None:
    """The pooling rule of a sentence-transformers directory; None for a plain HF directory.

    Refuses what this module cannot reproduce (several modes at once, other modes, modules other than
    Transformer, Pooling, Dense and Normalize, a Dense before the pooling) rather than embed differently.
    """
    path = Path(model_dir)
    if not (path / MODULES).is_file():
        return None
    modules = json.loads((path / MODULES).read_text(encoding="utf-8"))
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    unknown = [k for k in kinds if k not in ("Transformer", "Pooling", "Dense", "Normalize")]
    if unknown or kinds[:2] != ["Transformer", "Pooling"]:
        raise ValueError(
            f"{path / MODULES}: modules {kinds} are not Transformer, Pooling[, Dense][, Normalize]"
        )
    pooling_dir = path / modules[1]["path"]
    flags = json.loads((pooling_dir / "config.json").read_text(encoding="utf-8"))
    chosen = [flag for flag in _MODE_FLAGS if flags.get(flag)]
    modes = [_MODE_FLAGS[flag] for flag in chosen]
    if len(modes) != 1 or modes[0] is None:
        raise ValueError(
            f"{pooling_dir / 'config.json'}: pooling {chosen} is not exactly one of mean, cls, max"
        )
    return Pooling(mode=cast(PoolingMode, modes[0]), normalize=kinds[-1] == "Normalize")


def read_projection(model_dir: str | Path) -> nn.Linear | None:
    """The Dense module of a sentence-transformers directory as an nn.Linear (identity activation only)."""
    path = Path(model_dir)
    if not (path / MODULES).is_file():
        return None
    dense = [
        m for m in json.loads((path / MODULES).read_text(encoding="utf-8")) if m["type"].endswith("Dense")
    ]
    if not dense:
        return None
    if len(dense) > 1:
        raise ValueError(f"{path / MODULES}: more than one Dense module")
    folder = path / dense[0]["path"]
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if config.get("activation_function", _IDENTITY) != _IDENTITY:
        raise ValueError(
            f"{folder}: Dense activation {config['activation_function']} (only identity is read)"
        )
    layer = nn.Linear(int(config["in_features"]), int(config["out_features"]), bias=bool(config["bias"]))
    weights = load_file(str(folder / "model.safetensors"))
    layer.load_state_dict({k.removeprefix("linear."): v for k, v in weights.items()})
    return layer


def read_max_length(model_dir: str | Path) -> int | None:
    """sentence-transformers' max_seq_length (256 for MiniLM, below its 512 positions), if written."""
    path = Path(model_dir) / ST_CONFIG
    if not path.is_file():
        return None
    value = json.loads(path.read_text(encoding="utf-8")).get("max_seq_length")
    return int(value) if value else None


@torch.inference_mode()
def encode(
    model: SentenceEncoder,
    tokenizer: PreTrainedTokenizerBase,
    sentences: Sequence[str],
    *,
    batch_size: int = 32,
    max_length: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> torch.Tensor:
    """[N, D] float32 embeddings on the CPU, in the order given; batches are formed by length (less padding).
    `progress` is told how many sentences are done after each batch."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    length = min(max_length or model.max_length, model.max_length)
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    out = torch.empty(len(sentences), model.dim)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        batch = tokenizer(
            [sentences[i] for i in rows],
            padding=True,
            truncation=True,
            max_length=length,
            return_tensors="pt",
        )
        inputs = {
            k: v.to(device)
            for k, v in batch.items()
            if k in ("input_ids", "attention_mask", "token_type_ids")
        }
        out[rows] = model(**inputs).embedding.float().cpu()
        if progress is not None:
            progress(start + len(rows))
    model.train(was_training)
    return out


def describe(model: SentenceEncoder) -> dict[str, Any]:
    """What a report says of an embedding model beyond its size."""
    return {
        "pooling": asdict(model.pooling),
        "embedding_dim": model.dim,
        "projection": None if model.projection is None else [model.projection.in_features, model.dim],
        "max_length": model.max_length,
    }


def _describe(pooling: Pooling) -> str:
    return pooling.mode + (" + normalize" if pooling.normalize else "")


def _relative_positions(config: Any) -> bool:
    """BERT's SDPA attention cannot score relative positions (see training/models.py)."""
    return getattr(config, "position_embedding_type", None) not in (None, "absolute")


def _write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
