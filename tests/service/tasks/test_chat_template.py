"""The service renders chat messages exactly as transformers' `apply_chat_template` does, without it."""

from __future__ import annotations

from typing import Any

import pytest

from service.manifest import ChatTemplateSpec
from service.tasks.chat_template import ChatTemplate, ChatTemplateError, compile_chat_template
from tests.tiny_models import CHAT_TEMPLATE

SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Llama-2's shape: bos_token/eos_token variables, raise_exception, whitespace control by trim/lstrip blocks
LLAMA2 = """{{ bos_token }}
{% for message in messages %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% if message['role'] == 'user' %}
        {{ '[INST] ' + message['content'] | trim + ' [/INST]' }}
    {% else %}
        {{ ' ' + message['content'] | trim + ' ' + eos_token }}
    {% endif %}
{% endfor %}"""
# tojson (HF's: no HTML escaping, non-ASCII kept), loop controls, the {% generation %} block
JSONY = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
    "{{ m | tojson }}{% generation %}|{{ m['content'] | length }}{% endgeneration %}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "Be brief & <kind>."},
    {"role": "user", "content": "Où est le café? 日本"},
    {"role": "assistant", "content": "Ici."},
    {"role": "user", "content": "Merci"},
]


def hf_render(template: str, messages: list[dict[str, Any]]) -> str:
    from tests.tiny_models import llama_bpe

    tokenizer = llama_bpe()
    tokenizer.bos_token, tokenizer.eos_token = "<s>", "</s>"
    rendered = tokenizer.apply_chat_template(
        messages, chat_template=template, tokenize=False, add_generation_prompt=True
    )
    assert isinstance(rendered, str)
    return rendered


def render(template: str, messages: list[dict[str, Any]]) -> str:
    return ChatTemplate(ChatTemplateSpec(template=template, bos_token="<s>", eos_token="</s>")).render(
        messages
    )


@pytest.mark.parametrize("template", [SMOLLM2, CHAT_TEMPLATE, JSONY])
def test_renders_as_transformers_does(template: str) -> None:
    assert render(template, CONVERSATION) == hf_render(template, CONVERSATION)
    assert render(template, CONVERSATION[1:2]) == hf_render(template, CONVERSATION[1:2])


def test_bos_and_eos_tokens_and_whitespace_control_as_transformers() -> None:
    messages = [CONVERSATION[1], CONVERSATION[2], CONVERSATION[3]]
    rendered = render(LLAMA2, messages)
    assert rendered == hf_render(LLAMA2, messages)
    assert rendered.startswith("<s>\n") and "[INST] Où est" in rendered and " Ici. </s>" in rendered


def test_raise_exception_refuses_the_conversation_with_its_message() -> None:
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        render(LLAMA2, [CONVERSATION[1], CONVERSATION[1]])


def test_the_sandbox_keeps_templates_away_from_python_internals() -> None:
    with pytest.raises(ChatTemplateError):
        render("{{ messages.__class__.__mro__[1].__subclasses__() }}", CONVERSATION)
    with pytest.raises(ChatTemplateError):  # immutable: a template cannot change the messages
        render("{{ messages.append(1) }}", CONVERSATION)


def test_strftime_now_is_there() -> None:
    assert render("{{ strftime_now('%Y') }}", CONVERSATION).isdigit()


def test_no_template_or_a_broken_one_is_a_reason_not_a_crash() -> None:
    assert compile_chat_template(None) == (
        None,
        "it has no chat template (exported from a tokenizer without one)",
    )
    template, reason = compile_chat_template(ChatTemplateSpec(template="{% for m in messages %}"))
    assert template is None and reason is not None and "does not compile" in reason
