#!/usr/bin/env python3
"""Drives a running `strata serve` with the official `openai` Python client (test-only; run by
serve/server_test.cc): completions and chat, streamed and not, for one seed, one bad request and
the model list. Prints one JSON object with what the client received.

    .venv/bin/python tools/ref/openai_client.py BASE_URL MODEL PROMPT
"""
import json
import sys

import openai


def main() -> int:
    base_url, model, prompt = sys.argv[1:4]
    client = openai.OpenAI(base_url=base_url, api_key="test-key", max_retries=0, timeout=60.0)
    out = {}

    completion = dict(model=model, prompt=prompt, max_tokens=12, temperature=0.8, seed=5)
    c = client.completions.create(**completion)
    out["completion"] = c.choices[0].text
    out["completion_finish"] = c.choices[0].finish_reason
    out["completion_usage"] = c.usage.model_dump(exclude_none=True)
    streamed, streamed_finish = "", None
    for chunk in client.completions.create(**completion, stream=True):
        for ch in chunk.choices:
            streamed += ch.text
            if ch.finish_reason:
                streamed_finish = ch.finish_reason
    out["completion_stream"] = streamed
    out["completion_stream_finish"] = streamed_finish

    chat = dict(model=model,
                messages=[{"role": "system", "content": "You are terse."},
                          {"role": "user", "content": prompt}],
                max_tokens=10, temperature=0.7, seed=11)
    r = client.chat.completions.create(**chat)
    out["chat"] = r.choices[0].message.content
    out["chat_role"] = r.choices[0].message.role
    out["chat_usage"] = r.usage.model_dump(exclude_none=True)
    chat_streamed, role = "", None
    for chunk in client.chat.completions.create(**chat, stream=True,
                                                stream_options={"include_usage": True}):
        for ch in chunk.choices:
            if ch.delta.role:
                role = ch.delta.role
            if ch.delta.content:
                chat_streamed += ch.delta.content
        if chunk.usage:
            out["chat_stream_usage"] = chunk.usage.model_dump(exclude_none=True)
    out["chat_stream"] = chat_streamed
    out["chat_stream_role"] = role

    try:
        client.completions.create(**{**completion, "max_tokens": -3})
        out["bad_status"] = 0
    except openai.APIStatusError as e:
        out["bad_status"] = e.status_code
        out["bad_message"] = e.message
        body = e.body if isinstance(e.body, dict) else {}
        out["bad_param"] = body.get("param")
    out["models"] = [m.id for m in client.models.list().data]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
