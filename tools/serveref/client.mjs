// Drives a running `strata serve` with the official `openai` npm client (test-only; run by
// serve/openai_client_test.cc): completions and chat, streamed and not, for one seed, and one bad
// request. Prints one JSON object with what the client received.
// Usage: node client.mjs BASE_URL MODEL PROMPT
import OpenAI from "openai";

const [baseURL, model, prompt] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "test-key", maxRetries: 0, timeout: 60000 });
const out = {};

const completion = { model, prompt, max_tokens: 12, temperature: 0.8, seed: 5 };
const c = await client.completions.create(completion);
out.completion = c.choices[0].text;
out.completion_finish = c.choices[0].finish_reason;
out.completion_usage = c.usage;
let streamed = "";
let streamedFinish = null;
for await (const chunk of await client.completions.create({ ...completion, stream: true })) {
  for (const ch of chunk.choices) {
    streamed += ch.text;
    if (ch.finish_reason) streamedFinish = ch.finish_reason;
  }
}
out.completion_stream = streamed;
out.completion_stream_finish = streamedFinish;

const chat = {
  model,
  messages: [
    { role: "system", content: "You are terse." },
    { role: "user", content: prompt },
  ],
  max_tokens: 10,
  temperature: 0.7,
  seed: 11,
};
const r = await client.chat.completions.create(chat);
out.chat = r.choices[0].message.content;
out.chat_role = r.choices[0].message.role;
out.chat_usage = r.usage;
let chatStreamed = "";
let role = null;
for await (const chunk of await client.chat.completions.create({
  ...chat,
  stream: true,
  stream_options: { include_usage: true },
})) {
  for (const ch of chunk.choices) {
    if (ch.delta.role) role = ch.delta.role;
    if (ch.delta.content) chatStreamed += ch.delta.content;
  }
  if (chunk.usage) out.chat_stream_usage = chunk.usage;
}
out.chat_stream = chatStreamed;
out.chat_stream_role = role;

try {
  await client.completions.create({ ...completion, max_tokens: -3 });
  out.bad_status = 0;
} catch (e) {
  out.bad_status = e.status;
  out.bad_message = e.message;
  out.bad_param = e.param;
}
const models = await client.models.list();
out.models = models.data.map((m) => m.id);
console.log(JSON.stringify(out));
