"""scripts/device/pack_student.py: a student trained with frozen embeddings leaves a machine as its own
tensors and comes back, beside its teacher, as the same model."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.tiny_models import build_tiny_llama
from training import distil_lm

SCRIPT = Path(__file__).parents[2] / "scripts" / "device" / "pack_student.py"


@pytest.fixture(scope="module")
def pack_student() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pack_student", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _student(teacher_dir: Path, out: Path, freeze: bool) -> Path:
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir)
    student = distil_lm.student_from_teacher(
        teacher, distil_lm.DistilLMConfig(layers=1, freeze_embeddings=freeze)
    )
    with torch.no_grad():  # as if trained: every tensor but the embeddings moved
        for tensor in student.parameters():
            if tensor.requires_grad:
                tensor.add_(0.01 * torch.randn_like(tensor))
    student.save_pretrained(out)
    (out / "train_state.json").write_text(json.dumps({"step": 3}))
    return out


def test_a_packed_student_unpacks_to_the_same_model(pack_student: ModuleType, tmp_path: Path) -> None:
    teacher = build_tiny_llama(tmp_path / "teacher")
    student = _student(teacher, tmp_path / "student", freeze=True)
    pack_student.pack(student, teacher, tmp_path / "packed", parts=3)
    assert len(list((tmp_path / "packed").glob("student.part*"))) == 3
    pack_student.unpack(tmp_path / "packed", teacher, tmp_path / "back")

    ids = torch.arange(12)[None]
    with torch.no_grad():
        before = AutoModelForCausalLM.from_pretrained(student)(ids).logits
        after = AutoModelForCausalLM.from_pretrained(tmp_path / "back")(ids).logits
    torch.testing.assert_close(after, before, atol=2e-3, rtol=0)  # float16 weights
    assert json.loads((tmp_path / "back" / "train_state.json").read_text()) == {"step": 3}
    assert (tmp_path / "back" / "tokenizer.json").exists()


def test_a_student_whose_embeddings_trained_is_refused(pack_student: ModuleType, tmp_path: Path) -> None:
    teacher = build_tiny_llama(tmp_path / "teacher")
    student = _student(teacher, tmp_path / "student", freeze=False)
    with pytest.raises(SystemExit, match="--freeze-embeddings"):
        pack_student.pack(student, teacher, tmp_path / "packed")
