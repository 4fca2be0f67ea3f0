#!/usr/bin/env python3
"""Renders every chat template in testdata/chat/*.jinja over a fixed set of conversations with
transformers' chat-template renderer (the jinja2 environment apply_chat_template uses) and writes
testdata/chat/ref.json, the reference io/chat_template_test.cc compares Strata's built-in
renderers against.

    .venv/bin/python tools/ref/render_chat.py        (scripts/setup.sh makes .venv)

transformers' apply_chat_template(conversation, chat_template=..., tokenize=False, **kwargs) renders
through transformers.utils.chat_template_utils.render_jinja_template with the tokenizer's special
tokens as variables; this script calls that function with the BOS / EOS texts of each template's
family, so no tokenizer (and no torch) is needed.
"""
import json
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHAT_DIR = ROOT / "testdata" / "chat"

# Which built-in renders each file (Detect() must pick it), the BOS/EOS texts of that family's
# tokenizer, whether ByName(builtin) renders it too, and whether only the renderings with a
# generation prompt are comparable (an early Llama 3 revision always appended the assistant
# header; the built-in follows the fixed template).
BOS = {"llama": "<|begin_of_text|>", "deepseek": "<\uFF5Cbegin\u2581of\u2581sentence\uFF5C>"}
EOS = {"llama": "<|eot_id|>", "deepseek": "<\uFF5Cend\u2581of\u2581sentence\uFF5C>",
       "qwen": "<|im_end|>", "kimi": "[EOS]"}
TEMPLATES = {
    "chatml.jinja": {"builtin": "chatml", "bos": "", "eos": EOS["qwen"]},
    "qwen2.jinja": {"builtin": "qwen2", "bos": "", "eos": EOS["qwen"]},
    # Qwen1.5's: the Qwen2 template with another default system prompt, which Detect() reads from
    # the template text; ByName("qwen2") has Qwen2's prompt, so only the detected one matches.
    "qwen1.5.jinja": {"builtin": "qwen2", "bos": "", "eos": EOS["qwen"], "by_name": False},
    "qwen2.5.jinja": {"builtin": "qwen2.5", "bos": "", "eos": EOS["qwen"]},
    "qwen3.jinja": {"builtin": "qwen3", "bos": "", "eos": EOS["qwen"]},
    "llama3.jinja": {"builtin": "llama3", "bos": BOS["llama"], "eos": EOS["llama"]},
    "llama3-lenml.jinja": {"builtin": "llama3", "bos": BOS["llama"], "eos": EOS["llama"],
                           "generation_prompt_only": True},
    "llama3.1.jinja": {"builtin": "llama3.1", "bos": BOS["llama"], "eos": EOS["llama"]},
    "deepseek2.jinja": {"builtin": "deepseek2", "bos": BOS["deepseek"], "eos": EOS["deepseek"]},
    "deepseek3.jinja": {"builtin": "deepseek3", "bos": BOS["deepseek"], "eos": EOS["deepseek"]},
    "kimi-k2.jinja": {"builtin": "kimi-k2", "bos": "[BOS]", "eos": EOS["kimi"]},
    "gemma3.jinja": {"builtin": "gemma", "bos": "<bos>", "eos": "<eos>"},
}


def S(content): return {"role": "system", "content": content}
def U(content): return {"role": "user", "content": content}
def A(content): return {"role": "assistant", "content": content}


CONVERSATIONS = {
    "system_user": [S("You are a terse assistant."), U("Hello!")],
    "user_only": [U("What is 2+2?")],
    "multi_turn": [S("Be brief."), U("Hi."), A("Hello, how can I help?"), U("Tell me a joke.")],
    "multi_turn_ends_assistant": [U("Name a colour."), A("Blue."), U("Another?"), A("Green.")],
    "whitespace": [S("  padded system \n"), U("\n  leading and trailing  \n\n"),
                   A(" reply with spaces "), U("\tTabbed\t line\r\n")],
    "unicode": [
        U("Gr\u00FC\u00DFe, \u4E16\u754C! \U0001F30D \u00BD caf\u00E9 \u2014 na\u00EFve"),
        A("\u3053\u3093\u306B\u3061\u306F \U0001F44B\U0001F3FD"),
        U("\u0395\u03BB\u03BB\u03B7\u03BD\u03B9\u03BA\u03AC; "
          "\u0440\u0443\u0441\u0441\u043A\u0438\u0439? \u05E2\u05D1\u05E8\u05D9\u05EA"),
    ],
    "think_history": [U("First question?"), A("<think>\nreasoning one\n</think>\n\nanswer one"),
                      U("Second question?"), A("<think>step by step</think>final answer")],
    "think_after_last_query": [U("Solve it."), A("\n\n<think>\n\nplan\n\n</think>\n\n\ndone")],
    "tool_response_user": [U("Look it up."), A("<think>need data</think>Calling."),
                           U("<tool_response>42</tool_response>"),
                           A("<think>got it</think>The answer is 42.")],
    "repeated_roles_late_system": [U("a"), U("b"), S("late system"), A("c"), A("d")],
    "empty_contents": [S(""), U("")],
    "assistant_first": [A("I start."), U("ok")],
    "special_text": [U("<|im_start|> and <|eot_id|> written as text"), A("fine")],
}

# Conversations also rendered with enable_thinking=False (Qwen3's switch; the other templates must
# ignore it).
NO_THINK_CONVERSATIONS = ["system_user", "multi_turn", "think_history"]


def render(source, info, messages, add_generation_prompt, enable_thinking=None):
    """The rendered text, or {"error": message} where the template raises (Gemma's refuses roles
    that do not alternate); Strata's Validate() must refuse those conversations."""
    from jinja2.exceptions import TemplateError
    from transformers.utils.chat_template_utils import render_jinja_template
    kwargs = {"bos_token": info["bos"], "eos_token": info["eos"]}
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    try:
        rendered, _ = render_jinja_template(conversations=[messages], chat_template=source,
                                            add_generation_prompt=add_generation_prompt, **kwargs)
    except TemplateError as e:
        return {"error": str(e)}
    return rendered[0]


def text_or_error(entry, result):
    return {**entry, **(result if isinstance(result, dict) else {"text": result})}


def main() -> int:
    files = sorted(p.name for p in CHAT_DIR.glob("*.jinja"))
    for f in files:
        if f not in TEMPLATES:
            print(f"render_chat: {f}: no entry in TEMPLATES", file=sys.stderr)
            return 1
    out = {"generator": "tools/ref/render_chat.py with transformers=="
                        f"{version('transformers')} (jinja2=={version('jinja2')})",
           "templates": {}, "conversations": CONVERSATIONS, "renders": []}
    for f in files:
        info = TEMPLATES[f]
        out["templates"][f] = info
        source = (CHAT_DIR / f).read_text(encoding="utf-8")
        for name, messages in CONVERSATIONS.items():
            for gen in (False, True):
                if info.get("generation_prompt_only") and not gen:
                    continue
                entry = {"template": f, "conversation": name, "add_generation_prompt": gen}
                out["renders"].append(text_or_error(entry, render(source, info, messages, gen)))
                if name in NO_THINK_CONVERSATIONS:
                    entry = {**entry, "enable_thinking": False}
                    out["renders"].append(
                        text_or_error(entry, render(source, info, messages, gen, False)))
    (CHAT_DIR / "ref.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n",
                                       encoding="utf-8")
    print(f"wrote {len(out['renders'])} renderings of {len(files)} templates to testdata/chat/ref.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
