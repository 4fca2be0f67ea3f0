// Renders every chat template in testdata/chat/*.jinja over a fixed set of conversations with
// @huggingface/jinja (the Jinja engine transformers.js uses for apply_chat_template) and writes
// testdata/chat/ref.json, the reference io/chat_template_test.cc compares Strata's built-in
// renderers against.
//
// Usage (from the repository root):
//   NODE_PATH=/path/to/node_modules node tools/tokref/render_chat.mjs
// or, with tools/tokref/package.json installed, `node tools/tokref/render_chat.mjs`.
// Needs the npm package @huggingface/jinja (tested with 0.5.11).
import { createRequire } from "node:module";
import { readFileSync, writeFileSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

// NODE_PATH is honoured by require(), not by ESM import, so resolve through require.
const require = createRequire(import.meta.url);
const { Template } = require("@huggingface/jinja");

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const chatDir = join(root, "testdata", "chat");

// Which built-in renders each file (Detect() must pick it), the BOS/EOS texts of that family's
// tokenizer, whether ByName(builtin) renders it too, and whether only the renderings with a
// generation prompt are comparable (an early Llama 3 revision always
// appended the assistant header; the built-in follows the fixed template).
const kBos = {
  llama: "<|begin_of_text|>",
  deepseek: "<\uFF5Cbegin\u2581of\u2581sentence\uFF5C>",
};
const kEos = {
  llama: "<|eot_id|>",
  deepseek: "<\uFF5Cend\u2581of\u2581sentence\uFF5C>",
  qwen: "<|im_end|>",
  kimi: "[EOS]",
};
const kTemplates = {
  "chatml.jinja": { builtin: "chatml", bos: "", eos: kEos.qwen },
  "qwen2.jinja": { builtin: "qwen2", bos: "", eos: kEos.qwen },
  // Qwen1.5's: the Qwen2 template with another default system prompt, which Detect() reads from
  // the template text; ByName("qwen2") has Qwen2's prompt, so only the detected one matches.
  "qwen1.5.jinja": { builtin: "qwen2", bos: "", eos: kEos.qwen, by_name: false },
  "qwen2.5.jinja": { builtin: "qwen2.5", bos: "", eos: kEos.qwen },
  "qwen3.jinja": { builtin: "qwen3", bos: "", eos: kEos.qwen },
  "llama3.jinja": { builtin: "llama3", bos: kBos.llama, eos: kEos.llama },
  "llama3-lenml.jinja": {
    builtin: "llama3", bos: kBos.llama, eos: kEos.llama, generation_prompt_only: true,
  },
  "llama3.1.jinja": { builtin: "llama3.1", bos: kBos.llama, eos: kEos.llama },
  "deepseek2.jinja": { builtin: "deepseek2", bos: kBos.deepseek, eos: kEos.deepseek },
  "deepseek3.jinja": { builtin: "deepseek3", bos: kBos.deepseek, eos: kEos.deepseek },
  "kimi-k2.jinja": { builtin: "kimi-k2", bos: "[BOS]", eos: kEos.kimi },
};

const S = (content) => ({ role: "system", content });
const U = (content) => ({ role: "user", content });
const A = (content) => ({ role: "assistant", content });

const kConversations = {
  system_user: [S("You are a terse assistant."), U("Hello!")],
  user_only: [U("What is 2+2?")],
  multi_turn: [S("Be brief."), U("Hi."), A("Hello, how can I help?"), U("Tell me a joke.")],
  multi_turn_ends_assistant: [U("Name a colour."), A("Blue."), U("Another?"), A("Green.")],
  whitespace: [
    S("  padded system \n"),
    U("\n  leading and trailing  \n\n"),
    A(" reply with spaces "),
    U("\tTabbed\t line\r\n"),
  ],
  unicode: [
    U("Gr\u00FC\u00DFe, \u4E16\u754C! \u{1F30D} \u00BD caf\u00E9 \u2014 na\u00EFve"),
    A("\u3053\u3093\u306B\u3061\u306F \u{1F44B}\u{1F3FD}"),
    U("\u0395\u03BB\u03BB\u03B7\u03BD\u03B9\u03BA\u03AC; \u0440\u0443\u0441\u0441\u043A\u0438\u0439? \u05E2\u05D1\u05E8\u05D9\u05EA"),
  ],
  think_history: [
    U("First question?"),
    A("<think>\nreasoning one\n</think>\n\nanswer one"),
    U("Second question?"),
    A("<think>step by step</think>final answer"),
  ],
  think_after_last_query: [
    U("Solve it."),
    A("\n\n<think>\n\nplan\n\n</think>\n\n\ndone"),
  ],
  tool_response_user: [
    U("Look it up."),
    A("<think>need data</think>Calling."),
    U("<tool_response>42</tool_response>"),
    A("<think>got it</think>The answer is 42."),
  ],
  repeated_roles_late_system: [U("a"), U("b"), S("late system"), A("c"), A("d")],
  empty_contents: [S(""), U("")],
  assistant_first: [A("I start."), U("ok")],
  special_text: [U("<|im_start|> and <|eot_id|> written as text"), A("fine")],
};

// Conversations also rendered with enable_thinking=false (Qwen3's switch; the other templates
// must ignore it).
const kNoThinkConversations = ["system_user", "multi_turn", "think_history"];

function render(source, info, messages, addGenerationPrompt, enableThinking) {
  const context = {
    messages,
    add_generation_prompt: addGenerationPrompt,
    bos_token: info.bos,
    eos_token: info.eos,
  };
  if (enableThinking !== undefined) context.enable_thinking = enableThinking;
  return new Template(source).render(context);
}

const files = readdirSync(chatDir).filter((f) => f.endsWith(".jinja")).sort();
for (const f of files) {
  if (!(f in kTemplates)) throw new Error(`${f}: no entry in kTemplates`);
}
const out = { generator: "tools/tokref/render_chat.mjs with @huggingface/jinja", templates: {},
              conversations: kConversations, renders: [] };
for (const f of files) {
  const info = kTemplates[f];
  out.templates[f] = info;
  const source = readFileSync(join(chatDir, f), "utf8");
  for (const [name, messages] of Object.entries(kConversations)) {
    for (const gen of [false, true]) {
      if (info.generation_prompt_only && !gen) continue;
      out.renders.push({
        template: f, conversation: name, add_generation_prompt: gen,
        text: render(source, info, messages, gen),
      });
      if (kNoThinkConversations.includes(name)) {
        out.renders.push({
          template: f, conversation: name, add_generation_prompt: gen, enable_thinking: false,
          text: render(source, info, messages, gen, false),
        });
      }
    }
  }
}
writeFileSync(join(chatDir, "ref.json"), JSON.stringify(out, null, 1) + "\n");
console.log(`wrote ${out.renders.length} renderings of ${files.length} templates to testdata/chat/ref.json`);
