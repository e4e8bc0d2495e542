"""Prompts as the published numbers were made: a fastchat template or the tokenizer's own chat template, an
optional system prompt and suffix, each model config naming the reference it follows (``prompt_source``).

* Vicuna (Spec-Bench ``evaluation/eval.py``, and the TR paper on it): fastchat's ``vicuna`` template
  (``vicuna_v1.1``, its own system message), the prompt tokenized with BOS.
* Llama-2-chat (EAGLE ``eagle/evaluation/gen_ea_answer_llama2chat.py``): fastchat's ``llama-2`` template with
  the default Llama-2 system prompt, and one space after the prompt text.
* Llama-3-Instruct (EAGLE ``eagle/evaluation/gen_ea_answer_llama3chat.py``): the tokenizer's chat template
  with the same system prompt as a system message, tokenized without adding special tokens.

Turn ``k`` is built on the method's own answers to turns ``1..k-1``.
"""
from __future__ import annotations

from methods.common import HarnessError

CHAT_TEMPLATE = "chat_template"

# System prompts by name (model.system_prompt may name one, or give the text itself).
SYSTEM_PROMPTS = {
    # Meta's default Llama-2-chat system prompt, as EAGLE's Llama-2 and Llama-3 evaluation scripts set it.
    "llama-2-default": (
        "You are a helpful, respectful and honest assistant. Always answer as helpfully as possible, while being "
        "safe.  Your answers should not include any harmful, unethical, racist, sexist, toxic, dangerous, or "
        "illegal content. Please ensure that your responses are socially unbiased and positive in nature.\n\n"
        "If a question does not make any sense, or is not factually coherent, explain why instead of answering "
        "something not correct. If you don't know the answer to a question, please don't share false "
        "information."),
}


def system_text(spec) -> str | None:
    return SYSTEM_PROMPTS.get(spec.system_prompt, spec.system_prompt)


def check_template(spec, tok) -> None:
    if spec.template == CHAT_TEMPLATE:
        if not getattr(tok, "chat_template", None):
            raise HarnessError("model.template=chat_template but the tokenizer ships no chat template; "
                               "name a fastchat template instead (e.g. vicuna_v1.1)")
        return
    from fastchat.conversation import conv_templates

    if spec.template not in conv_templates:
        raise HarnessError(f"unknown fastchat template '{spec.template}'; e.g. vicuna_v1.1, llama-2, llama-3 "
                           f"(fastchat knows {len(conv_templates)}), or chat_template for the tokenizer's own")


def describe(spec) -> dict:
    """The prompt format for the run summary."""
    system = system_text(spec)
    return {"template": spec.template if spec.template == CHAT_TEMPLATE else f"fastchat {spec.template}",
            "system_prompt": spec.system_prompt if spec.system_prompt in SYSTEM_PROMPTS
            else ("the template's own" if system is None else system),
            "suffix": spec.prompt_suffix, "source": spec.prompt_source or "not stated in the model config"}


def prompt_ids(spec, tok, user_turns: list[str], answers: list[str]) -> list[int]:
    """Token ids of the prompt for the last of ``user_turns``, given the answers to the earlier ones, in the
    prompt format of model spec ``spec`` (its ``template``, ``system_prompt`` and ``prompt_suffix``)."""
    assert len(answers) == len(user_turns) - 1
    system = system_text(spec)
    if spec.template == CHAT_TEMPLATE:
        messages = [{"role": "system", "content": system}] if system is not None else []
        for i, user in enumerate(user_turns):
            messages.append({"role": "user", "content": user})
            if i < len(answers):
                messages.append({"role": "assistant", "content": answers[i]})
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tok(text + spec.prompt_suffix, add_special_tokens=False).input_ids
    from fastchat.conversation import get_conv_template

    conv = get_conv_template(spec.template)
    if system is not None:
        conv.set_system_message(system)
    for i, user in enumerate(user_turns):
        conv.append_message(conv.roles[0], user)
        conv.append_message(conv.roles[1], answers[i] if i < len(answers) else None)
    return tok(conv.get_prompt() + spec.prompt_suffix).input_ids


def consecutive_prompt_ids(spec, tok, user_turns: list[str]) -> list[int]:
    """Token ids of a prompt of ``user_turns`` as consecutive user messages with no answer between (SpecTTS-Bench's
    own Best-of-N loop appends the question once more for each sample: ``evaluation.running.paradigms``)."""
    system = system_text(spec)
    if spec.template == CHAT_TEMPLATE:
        messages = [{"role": "system", "content": system}] if system is not None else []
        messages += [{"role": "user", "content": user} for user in user_turns]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tok(text + spec.prompt_suffix, add_special_tokens=False).input_ids
    from fastchat.conversation import get_conv_template

    conv = get_conv_template(spec.template)
    if system is not None:
        conv.set_system_message(system)
    for user in user_turns:
        conv.append_message(conv.roles[0], user)
    conv.append_message(conv.roles[1], None)
    return tok(conv.get_prompt() + spec.prompt_suffix).input_ids


END_OF_THINKING = "</think>"  # the reasoning models' (Qwen3, the DeepSeek-R1 distills) end of their thinking


def thinking_marker(spec, tok) -> str | None:
    """The text whose last occurrence a reasoning model's final answer follows: the model config's
    (``thinking.answer_after``), else the tokenizer's end-of-thinking token where it has one, else None (a model
    that does not think)."""
    if spec.thinking and spec.thinking.get("answer_after"):
        return spec.thinking["answer_after"]
    return END_OF_THINKING if END_OF_THINKING in tok.get_vocab() else None


def end_of_thinking_id(tok) -> int | None:
    """The tokenizer's end-of-thinking token, found in its vocabulary (not a hard-coded id), or None."""
    return tok.get_vocab().get(END_OF_THINKING)
