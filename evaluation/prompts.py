"""Prompts as Spec-Bench builds them: a fastchat template, or the tokenizer's own chat template.

Turn ``k`` is built on the method's own answers to turns ``1..k-1``.
"""
from __future__ import annotations

from evaluation.errors import HarnessError

CHAT_TEMPLATE = "chat_template"


def check_template(template: str, tok) -> None:
    if template == CHAT_TEMPLATE:
        if not getattr(tok, "chat_template", None):
            raise HarnessError("model.template=chat_template but the tokenizer ships no chat template; "
                               "name a fastchat template instead (e.g. vicuna_v1.1)")
        return
    from fastchat.conversation import conv_templates

    if template not in conv_templates:
        raise HarnessError(f"unknown fastchat template '{template}'; e.g. vicuna_v1.1, llama-2, llama-3 "
                           f"(fastchat knows {len(conv_templates)}), or chat_template for the tokenizer's own")


def prompt_ids(template: str, tok, user_turns: list[str], answers: list[str]) -> list[int]:
    """Token ids of the prompt for the last of ``user_turns``, given the answers to the earlier ones."""
    assert len(answers) == len(user_turns) - 1
    if template == CHAT_TEMPLATE:
        messages = []
        for i, user in enumerate(user_turns):
            messages.append({"role": "user", "content": user})
            if i < len(answers):
                messages.append({"role": "assistant", "content": answers[i]})
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False).input_ids
    from fastchat.conversation import get_conv_template

    conv = get_conv_template(template)
    for i, user in enumerate(user_turns):
        conv.append_message(conv.roles[0], user)
        conv.append_message(conv.roles[1], answers[i] if i < len(answers) else None)
    return tok(conv.get_prompt()).input_ids
