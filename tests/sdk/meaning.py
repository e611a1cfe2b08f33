#!/usr/bin/env python3
"""A fallback keeps the request's meaning (docs/translation.md), as the official Python SDKs see it.

Run by tests/tests/meaning.rs against a proxy whose routes translate every request:
structured output through each SDK's `parse` helpers (unary and streamed), a target
skipped for a schema it cannot express, reasoning (thinking blocks and their
signatures), and documents and media sent to Bedrock, Gemini and Vertex. It prints
one JSON line: what each SDK made of each answer. The Rust test compares it with what
the simulated providers were told to answer and checks what they received.

Inputs (environment):
  SWITCHBACK_URL   http://127.0.0.1:PORT
  SWITCHBACK_DOC   the URL of a PDF the Bedrock route must have fetched for it
"""

import json
import os
from typing import List

import anthropic
import openai
import pydantic

URL = os.environ["SWITCHBACK_URL"]
DOC = os.environ["SWITCHBACK_DOC"]
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="

oa = openai.OpenAI(base_url=URL + "/v1", api_key="sk-unused", max_retries=0)
an = anthropic.Anthropic(base_url=URL, api_key="sk-unused", max_retries=0)


class Event(pydantic.BaseModel):
    name: str
    date: str
    participants: List[str]


class Contact(pydantic.BaseModel):
    name: str
    email: str
    plan_interest: str
    demo_requested: bool


class Tree(pydantic.BaseModel):
    title: str
    children: List["Tree"]


EVENT_PROMPT = [
    {"role": "system", "content": "Extract the event."},
    {"role": "user", "content": "Alice and Bob are going to a science fair on Friday."},
]
CONTACT_PROMPT = [
    {"role": "user", "content": "Extract: Jane Doe (jane@example.com) wants Pro and a demo."}
]

out = {}

# -- Structured output, OpenAI SDK: chat.completions.parse on translated routes ------
for route in ["so-claude", "so-gemini", "so-bedrock"]:
    c = oa.chat.completions.parse(model=route, messages=EVENT_PROMPT, response_format=Event)
    m = c.choices[0].message
    out[f"openai-parse/{route}"] = {
        "parsed": m.parsed.model_dump() if m.parsed else None,
        "content": m.content,
        "finish_reason": c.choices[0].finish_reason,
    }

with oa.chat.completions.stream(
    model="so-claude", messages=EVENT_PROMPT, response_format=Event
) as stream:
    deltas = "".join(e.delta for e in stream if e.type == "content.delta")
    final = stream.get_final_completion()
out["openai-stream/so-claude"] = {
    "deltas": deltas,
    "parsed": final.choices[0].message.parsed.model_dump(),
}

# The Responses API: text.format travels as sent to the targets that serve it.
r = oa.responses.parse(
    model="so-responses",
    input="Alice and Bob are going to a science fair on Friday.",
    text_format=Event,
)
out["openai-responses-parse"] = {"parsed": r.output_parsed.model_dump()}

# JSON mode without a schema on Bedrock (a forced tool), unary and streamed.
c = oa.chat.completions.create(
    model="so-json-bedrock",
    messages=[{"role": "user", "content": "Who wrote the first compiler? JSON, keys name and year."}],
    response_format={"type": "json_object"},
)
out["openai-json-object/unary"] = {
    "json": json.loads(c.choices[0].message.content),
    "finish_reason": c.choices[0].finish_reason,
    "tool_calls": c.choices[0].message.tool_calls,
}
chunks = oa.chat.completions.create(
    model="so-json-bedrock",
    messages=[{"role": "user", "content": "Who wrote the first compiler? JSON, keys name and year."}],
    response_format={"type": "json_object"},
    stream=True,
)
text, finish = "", None
for ch in chunks:
    for choice in ch.choices:
        text += choice.delta.content or ""
        finish = choice.finish_reason or finish
out["openai-json-object/stream"] = {"json": json.loads(text), "finish_reason": finish}

# A schema the first target cannot express (recursion, on Gemini): skipped, the next
# target answers; when none can, a 400 naming the field and the targets.
c = oa.chat.completions.with_raw_response.parse(
    model="so-skip",
    messages=[{"role": "user", "content": "Outline the plan."}],
    response_format=Tree,
)
parsed = c.parse()
out["openai-parse/so-skip"] = {
    "parsed": parsed.choices[0].message.parsed.model_dump(),
    "target": c.headers.get("x-switchback-target"),
    "fallbacks": c.headers.get("x-switchback-fallbacks"),
}
try:
    oa.chat.completions.parse(
        model="so-none",
        messages=[{"role": "user", "content": "Outline the plan."}],
        response_format=Tree,
    )
    out["openai-parse/so-none"] = {"error": None}
except openai.BadRequestError as e:
    out["openai-parse/so-none"] = {"status": e.status_code, "error": e.body}

# -- Structured output, Anthropic SDK: messages.parse on translated routes ----------
for route in ["so-gpt", "so-gemini", "so-bedrock"]:
    m = an.messages.parse(
        model=route, max_tokens=512, messages=CONTACT_PROMPT, output_format=Contact
    )
    out[f"anthropic-parse/{route}"] = {
        "parsed": m.parsed_output.model_dump() if m.parsed_output else None,
        "blocks": [b.type for b in m.content],
        "stop_reason": m.stop_reason,
    }
with an.messages.stream(
    model="so-gpt", max_tokens=512, messages=CONTACT_PROMPT, output_format=Contact
) as stream:
    deltas = "".join(stream.text_stream)
    final = stream.get_final_message()
out["anthropic-stream/so-gpt"] = {
    "deltas": deltas,
    "parsed": final.parsed_output.model_dump() if final.parsed_output else None,
}

# -- Reasoning: thinking blocks reach an Anthropic client, signatures as they came --
THINK = {"type": "enabled", "budget_tokens": 2048}
PRIMES = [{"role": "user", "content": "How many primes are there below 100?"}]
for route in ["think-gemini", "think-bedrock"]:
    m = an.messages.create(model=route, max_tokens=4096, thinking=THINK, messages=PRIMES)
    out[f"anthropic-think/{route}"] = {
        "blocks": [b.model_dump() for b in m.content],
    }
    with an.messages.stream(
        model=route, max_tokens=4096, thinking=THINK, messages=PRIMES
    ) as stream:
        thinking = "".join(e.thinking for e in stream if e.type == "thinking")
        final = stream.get_final_message()
    out[f"anthropic-think-stream/{route}"] = {
        "thinking": thinking,
        "blocks": [b.model_dump() for b in final.content],
    }
# The answer goes back as history: the signature reaches Bedrock byte for byte.
m = an.messages.create(
    model="think-bedrock",
    max_tokens=4096,
    thinking=THINK,
    messages=PRIMES
    + [
        {"role": "assistant", "content": [b.model_dump() for b in final.content]},
        {"role": "user", "content": "And below 50?"},
    ],
)
out["anthropic-think/second-turn"] = {"text": m.content[-1].text}
# An OpenAI client's effort reaches Bedrock as Claude's budget; the answer is text.
c = oa.chat.completions.create(model="think-bedrock", messages=PRIMES, reasoning_effort="high")
out["openai-effort/think-bedrock"] = {"content": c.choices[0].message.content}

# -- Documents and media to Bedrock, Gemini and Vertex ------------------------------
DOCS = [
    {
        "role": "user",
        "content": [
            {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": "The grass is green."},
                "title": "Colours",
            },
            {"type": "document", "source": {"type": "url", "url": DOC}},
            {"type": "text", "text": "Compare them, then fetch the chart."},
        ],
    },
    {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_01Chart", "name": "fetch_chart", "input": {"id": "q3"}}],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_01Chart",
                "content": [
                    {"type": "text", "text": "The chart:"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                ],
            }
        ],
    },
]
CHART_TOOL = {
    "name": "fetch_chart",
    "description": "Fetch a chart by id",
    "input_schema": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
}
for route in ["docs-bedrock", "docs-gemini", "docs-vertex"]:
    m = an.messages.create(model=route, max_tokens=256, messages=DOCS, tools=[CHART_TOOL])
    out[f"anthropic-docs/{route}"] = {"text": m.content[0].text}

print(json.dumps(out))
