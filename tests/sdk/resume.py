#!/usr/bin/env python3
"""Resumed or hedged streams (docs/streaming.md) as the official Python SDKs parse them.

Run by tests/tests/streams.rs against a proxy whose routes resume (each route's first
target breaks its stream after a few words and the next continues it), and by
tests/tests/hedging.rs against routes that hedge a slow first token. Each SDK's
stream helper accumulates the stream into one message; this prints, as one JSON
line, what each SDK made of it: the message's text, id, model, usage and how many
content blocks (Anthropic) it holds. The Rust test compares them with the answer.

Inputs (environment):
  SWITCHBACK_URL              http://127.0.0.1:PORT
  SWITCHBACK_OPENAI_MODEL     chat route that resumes or hedges
  SWITCHBACK_ANTHROPIC_MODEL  messages route that resumes or hedges
"""

import json
import os

import anthropic
import openai

URL = os.environ["SWITCHBACK_URL"]
PROMPT = [{"role": "user", "content": "count to five"}]

out = {}

oa = openai.OpenAI(base_url=URL + "/v1", api_key="sk-unused", max_retries=0)
with oa.chat.completions.stream(
    model=os.environ["SWITCHBACK_OPENAI_MODEL"],
    messages=PROMPT,
    stream_options={"include_usage": True},
) as stream:
    deltas = "".join(
        e.delta for e in stream if e.type == "content.delta"
    )
    final = stream.get_final_completion()
out["openai"] = {
    "deltas": deltas,
    "text": final.choices[0].message.content,
    "finish_reason": final.choices[0].finish_reason,
    "id": final.id,
    "model": final.model,
    "usage": final.usage.model_dump() if final.usage else None,
}

an = anthropic.Anthropic(base_url=URL, api_key="sk-unused", max_retries=0)
with an.messages.stream(
    model=os.environ["SWITCHBACK_ANTHROPIC_MODEL"],
    max_tokens=64,
    messages=PROMPT,
) as stream:
    deltas = "".join(stream.text_stream)
    message = stream.get_final_message()
out["anthropic"] = {
    "deltas": deltas,
    "text": "".join(b.text for b in message.content if b.type == "text"),
    "blocks": len(message.content),
    "stop_reason": message.stop_reason,
    "id": message.id,
    "model": message.model,
    "usage": {
        "input_tokens": message.usage.input_tokens,
        "output_tokens": message.usage.output_tokens,
    },
}

print(json.dumps(out))
