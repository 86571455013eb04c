"""The served tasks, one module each; this table is the one place that lists them.

Adding a task: a module beside these that declares its `ServedTask` (request schema, pre- and
post-processing, its endpoints, its v2 interface, what it asks of the engine), and a line here. The manifest
schema (service.manifest) names the tasks an export may write.
"""

from __future__ import annotations

from service.tasks import classification, embeddings, fill_mask, generation, question_answering
from service.tasks.contract import ServedTask

TASKS: dict[str, ServedTask] = {
    task.name: task
    for task in (
        classification.TASK,
        question_answering.TASK,
        fill_mask.TASK,
        generation.TASK,
        embeddings.TASK,
    )
}
