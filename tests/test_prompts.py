"""Each shipped model config builds its prompts as the reference behind its published numbers did."""
import pytest

from evaluation.running.prompts import SYSTEM_PROMPTS, describe, prompt_ids
from methods.common import ROOT
from tests.checkpoints import sentencepiece_tokenizer
from tests.helpers import shipped_spec

TURNS = ["Compose an engaging travel blog post about a recent trip to Hawaii.", "Rewrite your previous response."]
ANSWER = "Aloha! Here is my post."


@pytest.fixture(scope="module")
def sp_tok(tmp_path_factory):
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tok")
    sentencepiece_tokenizer(folder)
    return AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("name", ["vicuna-7b", "vicuna-13b", "vicuna-33b"])
def test_vicuna_as_spec_bench_eval_py(name, sp_tok):
    """Spec-Bench evaluation/eval.py: fastchat get_conversation_template('vicuna'), prompt tokenized with BOS."""
    from fastchat.model import get_conversation_template

    spec = shipped_spec(name)
    conv = get_conversation_template("vicuna")
    conv.append_message(conv.roles[0], TURNS[0])
    conv.append_message(conv.roles[1], ANSWER)
    conv.append_message(conv.roles[0], TURNS[1])
    conv.append_message(conv.roles[1], None)
    assert prompt_ids(spec, sp_tok, TURNS, [ANSWER]) == sp_tok([conv.get_prompt()]).input_ids[0]
    assert "Spec-Bench evaluation/eval.py" in describe(spec)["source"]


def test_llama_2_chat_as_eagle_gen_ea_answer_llama2chat(sp_tok):
    """EAGLE's Llama-2-chat script: fastchat 'llama-2-chat' with the default system prompt, prompt + ' '."""
    from fastchat.model import get_conversation_template

    spec = shipped_spec("llama-2-7b-chat")
    conv = get_conversation_template("llama-2-chat")
    conv.system_message = SYSTEM_PROMPTS["llama-2-default"]
    conv.append_message(conv.roles[0], TURNS[0])
    conv.append_message(conv.roles[1], None)
    assert prompt_ids(spec, sp_tok, TURNS[:1], []) == sp_tok([conv.get_prompt() + " "]).input_ids[0]
    conv.messages[-1][-1] = ANSWER
    conv.append_message(conv.roles[0], TURNS[1])
    conv.append_message(conv.roles[1], None)
    assert prompt_ids(spec, sp_tok, TURNS, [ANSWER]) == sp_tok([conv.get_prompt() + " "]).input_ids[0]
    assert describe(spec)["system_prompt"] == "llama-2-default" and "gen_ea_answer_llama2chat" in spec.prompt_source


def test_llama_3_as_eagle_gen_ea_answer_llama3chat(embedded):
    """EAGLE's Llama-3 script: the tokenizer's chat template with the default Llama-2 system prompt as a
    system message, tokenized without added special tokens (a chat-template tokenizer stands in here)."""
    _, tok, _ = embedded
    spec = shipped_spec("llama-3-8b-instruct")
    assert spec.template == "chat_template" and spec.system_prompt == "llama-2-default"
    messages = [{"role": "system", "content": SYSTEM_PROMPTS["llama-2-default"]}, {"role": "user", "content": TURNS[0]},
                {"role": "assistant", "content": ANSWER}, {"role": "user", "content": TURNS[1]}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt_ids(spec, tok, TURNS, [ANSWER]) == tok([text], add_special_tokens=False).input_ids[0]
    assert "gen_ea_answer_llama3chat" in spec.prompt_source


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml")))
def test_every_model_config_names_its_prompt_source(name):
    spec = shipped_spec(name)
    assert spec.prompt_source and spec.system_prompt in (None, *SYSTEM_PROMPTS)
