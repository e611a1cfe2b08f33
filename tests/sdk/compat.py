#!/usr/bin/env python3
"""Compatibility of a running Switchback proxy with the official Python SDKs.

Drives the `openai` and `anthropic` packages against the proxy and checks that what
they parse (bodies, streams, errors, headers) is what docs/request-lifecycle.md promises. Run by
tests/tests/sdk.rs, which starts simulated providers and the proxy with matching
routes; it can also be pointed at any proxy serving routes of the same shape.

Inputs (environment):
  SWITCHBACK_URL                 http://127.0.0.1:PORT (required)
  SWITCHBACK_API_KEY             key the clients send (never reaches a provider)
  SWITCHBACK_OPENAI_MODEL        chat route answering normally
  SWITCHBACK_OPENAI_TARGET       its credential as `namespace/name` (x-switchback-target)
  SWITCHBACK_OPENAI_TEXT         its answer text
  SWITCHBACK_OPENAI_STREAM_MODEL chat route answering streams
  SWITCHBACK_OPENAI_STREAM_TEXT  the concatenated stream text
  SWITCHBACK_FALLBACK_MODEL      chat route whose first target fails with 503
  SWITCHBACK_FALLBACK_TARGET     the credential that answers it
  SWITCHBACK_FALLBACK_TEXT       the backup's answer text
  SWITCHBACK_FAILING_MODEL       chat route whose targets all fail with 5xx
  SWITCHBACK_FAILING_TARGETS     how many attempts its error lists at least (default 1)
  SWITCHBACK_EMBEDDING_MODEL     embeddings route
  SWITCHBACK_ANTHROPIC_MODEL     messages route answering normally
  SWITCHBACK_ANTHROPIC_TEXT      its answer text
  SWITCHBACK_ANTHROPIC_STREAM_MODEL  messages route answering streams
  SWITCHBACK_ANTHROPIC_STREAM_TEXT   the concatenated stream text
  SWITCHBACK_ANTHROPIC_FAILING_MODEL messages route whose targets all fail with 5xx
  SWITCHBACK_OPENAI_BREAK_MODEL  chat route whose stream breaks after a few events
  SWITCHBACK_OPENAI_BREAK_TEXT   the text delivered before the break
  SWITCHBACK_ANTHROPIC_BREAK_MODEL   messages route whose stream breaks after a few events
  SWITCHBACK_ANTHROPIC_BREAK_TEXT    the text delivered before the break
  SWITCHBACK_ANTHROPIC_OVERLOADED_MODEL  messages route whose first target streams an
                                 overloaded error event first, the second answers
  SWITCHBACK_ANTHROPIC_OVERLOADED_TEXT   the second target's stream text
  SWITCHBACK_UNKNOWN_MODEL       a name no route serves
  SWITCHBACK_FORBIDDEN_MODEL     a name a route serves that this key's client may not
                                 call (optional: its cases are skipped when unset)

Cross-provider routes (the proxy translates; the SDK must not notice):
  SWITCHBACK_OPENAI_X_MODEL      chat route served by an Anthropic target (unary)
  SWITCHBACK_OPENAI_X_TARGET     its credential
  SWITCHBACK_OPENAI_X_TEXT       its answer text
  SWITCHBACK_OPENAI_X_STREAM_MODEL  chat route served by a streaming Anthropic target
  SWITCHBACK_OPENAI_X_STREAM_TEXT   the concatenated stream text
  SWITCHBACK_OPENAI_X_TOOLS_MODEL   chat route whose Anthropic target answers, in turn:
                                 a tool call, a text answer, a tool call after some
                                 text, a text answer
  SWITCHBACK_OPENAI_X_TOOL_ID    the id of its tool calls (the upstream's tool_use id)
  SWITCHBACK_OPENAI_X_TOOLS_TEXT the answer after a tool result
  SWITCHBACK_OPENAI_X_TOOLS_PREAMBLE  the text before the second (streamed) tool call
  SWITCHBACK_OPENAI_X_FALLBACK_MODEL  chat route: an OpenAI target failing with 503,
                                 then an Anthropic target that answers
  SWITCHBACK_OPENAI_X_FALLBACK_TARGET the Anthropic credential
  SWITCHBACK_OPENAI_X_FALLBACK_TEXT   its answer text (unary; streams say the same)
  SWITCHBACK_ANTHROPIC_X_MODEL, _TARGET, _TEXT, _STREAM_MODEL, _STREAM_TEXT,
  _TOOLS_MODEL, _TOOL_ID, _TOOLS_TEXT, _TOOLS_PREAMBLE
                                 the same for messages routes served by OpenAI targets
  SWITCHBACK_CHAIN_MODEL, _TARGET, _TEXT
                                 chat route crossing three providers: azure-openai
                                 (429), gemini (503), then an Anthropic target that
                                 answers (unary; streams say the same)
  SWITCHBACK_RESPONSES_MODEL, _TARGET, _TEXT
                                 route for POST /v1/responses: an Anthropic target
                                 (skipped: it cannot serve it), an OpenAI one that
                                 answers 429, then an OpenAI one that answers
  SWITCHBACK_TOOL_NAME           the tool the simulated models call
  SWITCHBACK_TOOL_ARGS           the arguments they call it with (a JSON object)
  SWITCHBACK_SDK_CASES           comma-separated case names to run (default: all)

Optional *_TEXT / *_TARGET values are only checked when set. Prints one line per case
and `N passed, N failed` last; exits 1 when any case failed.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any, Callable

import anthropic
import openai

URL = os.environ.get("SWITCHBACK_URL", "").rstrip("/")
API_KEY = os.environ.get("SWITCHBACK_API_KEY", "sk-switchback-sdk-client")


def env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


OPENAI_MODEL = env("SWITCHBACK_OPENAI_MODEL", "sdk-chat")
OPENAI_TARGET = env("SWITCHBACK_OPENAI_TARGET")
OPENAI_TEXT = env("SWITCHBACK_OPENAI_TEXT")
OPENAI_STREAM_MODEL = env("SWITCHBACK_OPENAI_STREAM_MODEL", "sdk-chat-stream")
OPENAI_STREAM_TEXT = env("SWITCHBACK_OPENAI_STREAM_TEXT")
FALLBACK_MODEL = env("SWITCHBACK_FALLBACK_MODEL", "sdk-fallback")
FALLBACK_TARGET = env("SWITCHBACK_FALLBACK_TARGET")
FALLBACK_TEXT = env("SWITCHBACK_FALLBACK_TEXT")
FAILING_MODEL = env("SWITCHBACK_FAILING_MODEL", "sdk-failing")
FAILING_TARGETS = int(env("SWITCHBACK_FAILING_TARGETS", "1") or "1")
EMBEDDING_MODEL = env("SWITCHBACK_EMBEDDING_MODEL", "sdk-embedding")
ANTHROPIC_MODEL = env("SWITCHBACK_ANTHROPIC_MODEL", "sdk-claude")
ANTHROPIC_TEXT = env("SWITCHBACK_ANTHROPIC_TEXT")
ANTHROPIC_STREAM_MODEL = env("SWITCHBACK_ANTHROPIC_STREAM_MODEL", "sdk-claude-stream")
ANTHROPIC_STREAM_TEXT = env("SWITCHBACK_ANTHROPIC_STREAM_TEXT")
ANTHROPIC_FAILING_MODEL = env("SWITCHBACK_ANTHROPIC_FAILING_MODEL", "sdk-claude-failing")
OPENAI_BREAK_MODEL = env("SWITCHBACK_OPENAI_BREAK_MODEL", "sdk-chat-break")
OPENAI_BREAK_TEXT = env("SWITCHBACK_OPENAI_BREAK_TEXT")
ANTHROPIC_BREAK_MODEL = env("SWITCHBACK_ANTHROPIC_BREAK_MODEL", "sdk-claude-break")
ANTHROPIC_BREAK_TEXT = env("SWITCHBACK_ANTHROPIC_BREAK_TEXT")
ANTHROPIC_OVERLOADED_MODEL = env("SWITCHBACK_ANTHROPIC_OVERLOADED_MODEL", "sdk-claude-overloaded")
ANTHROPIC_OVERLOADED_TEXT = env("SWITCHBACK_ANTHROPIC_OVERLOADED_TEXT")
UNKNOWN_MODEL = env("SWITCHBACK_UNKNOWN_MODEL", "sdk-no-such-model")
FORBIDDEN_MODEL = env("SWITCHBACK_FORBIDDEN_MODEL")
# A key no LLMClient has (the proxy runs with --auth required).
WRONG_KEY = "sk-switchback-sdk-wrong-key"

OPENAI_X_MODEL = env("SWITCHBACK_OPENAI_X_MODEL", "sdk-x-claude")
OPENAI_X_TARGET = env("SWITCHBACK_OPENAI_X_TARGET")
OPENAI_X_TEXT = env("SWITCHBACK_OPENAI_X_TEXT")
OPENAI_X_STREAM_MODEL = env("SWITCHBACK_OPENAI_X_STREAM_MODEL", "sdk-x-claude-stream")
OPENAI_X_STREAM_TEXT = env("SWITCHBACK_OPENAI_X_STREAM_TEXT")
OPENAI_X_TOOLS_MODEL = env("SWITCHBACK_OPENAI_X_TOOLS_MODEL", "sdk-x-claude-tools")
OPENAI_X_TOOL_ID = env("SWITCHBACK_OPENAI_X_TOOL_ID")
OPENAI_X_TOOLS_TEXT = env("SWITCHBACK_OPENAI_X_TOOLS_TEXT")
OPENAI_X_TOOLS_PREAMBLE = env("SWITCHBACK_OPENAI_X_TOOLS_PREAMBLE")
OPENAI_X_FALLBACK_MODEL = env("SWITCHBACK_OPENAI_X_FALLBACK_MODEL", "sdk-x-fallback")
OPENAI_X_FALLBACK_TARGET = env("SWITCHBACK_OPENAI_X_FALLBACK_TARGET")
OPENAI_X_FALLBACK_TEXT = env("SWITCHBACK_OPENAI_X_FALLBACK_TEXT")
ANTHROPIC_X_MODEL = env("SWITCHBACK_ANTHROPIC_X_MODEL", "sdk-x-gpt")
ANTHROPIC_X_TARGET = env("SWITCHBACK_ANTHROPIC_X_TARGET")
ANTHROPIC_X_TEXT = env("SWITCHBACK_ANTHROPIC_X_TEXT")
ANTHROPIC_X_STREAM_MODEL = env("SWITCHBACK_ANTHROPIC_X_STREAM_MODEL", "sdk-x-gpt-stream")
ANTHROPIC_X_STREAM_TEXT = env("SWITCHBACK_ANTHROPIC_X_STREAM_TEXT")
ANTHROPIC_X_TOOLS_MODEL = env("SWITCHBACK_ANTHROPIC_X_TOOLS_MODEL", "sdk-x-gpt-tools")
ANTHROPIC_X_TOOL_ID = env("SWITCHBACK_ANTHROPIC_X_TOOL_ID")
ANTHROPIC_X_TOOLS_TEXT = env("SWITCHBACK_ANTHROPIC_X_TOOLS_TEXT")
ANTHROPIC_X_TOOLS_PREAMBLE = env("SWITCHBACK_ANTHROPIC_X_TOOLS_PREAMBLE")
TOOL_NAME = env("SWITCHBACK_TOOL_NAME", "get_weather") or "get_weather"
TOOL_ARGS: dict | None = json.loads(env("SWITCHBACK_TOOL_ARGS", "null") or "null")

CHAIN_MODEL = env("SWITCHBACK_CHAIN_MODEL", "sdk-x-chain")
CHAIN_TARGET = env("SWITCHBACK_CHAIN_TARGET")
CHAIN_TEXT = env("SWITCHBACK_CHAIN_TEXT")
CLOUD_MODEL = env("SWITCHBACK_CLOUD_MODEL", "sdk-x-cloud")
CLOUD_TARGET = env("SWITCHBACK_CLOUD_TARGET")
CLOUD_TEXT = env("SWITCHBACK_CLOUD_TEXT")
RESPONSES_MODEL = env("SWITCHBACK_RESPONSES_MODEL", "sdk-responses")
RESPONSES_TARGET = env("SWITCHBACK_RESPONSES_TARGET")
RESPONSES_TEXT = env("SWITCHBACK_RESPONSES_TEXT")
MESSAGES = [{"role": "user", "content": "hello"}]
SYSTEM = "You are terse."
WEATHER_QUESTION = "What is the weather in Zurich?"
TOOL_RESULT = "18C and sunny"
TOOL_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
}
OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": "Current weather for a city",
            "parameters": TOOL_SCHEMA,
        },
    }
]
ANTHROPIC_TOOLS = [
    {"name": TOOL_NAME, "description": "Current weather for a city", "input_schema": TOOL_SCHEMA}
]


class CheckFailed(AssertionError):
    pass


def check(cond: bool, what: str) -> None:
    if not cond:
        raise CheckFailed(what)


def eq(got: Any, want: Any, what: str) -> None:
    if got != want:
        raise CheckFailed(f"{what}: got {got!r}, want {want!r}")


def openai_client(api_key: str | None = None) -> openai.OpenAI:
    # Retries off: the proxy's retries and fallbacks are under test, not the SDK's.
    return openai.OpenAI(
        api_key=api_key or API_KEY, base_url=f"{URL}/v1", max_retries=0, timeout=30.0
    )


def anthropic_client(api_key: str | None = None) -> anthropic.Anthropic:
    # The Anthropic SDK appends /v1/... itself.
    return anthropic.Anthropic(
        api_key=api_key or API_KEY, base_url=URL, max_retries=0, timeout=30.0
    )


def error_object(e: Any) -> dict:
    """The `error` object of a gateway error response, read from the raw body."""
    try:
        body = e.response.json()
    except Exception as parse_error:  # noqa: BLE001
        raise CheckFailed(
            f"error response is not JSON ({parse_error}): {e.response.text!r}"
        ) from None
    check(isinstance(body, dict), f"error body is an object: {body!r}")
    err = body.get("error")
    check(isinstance(err, dict), f"error body has an `error` object: {body!r}")
    return err


def check_attempts(err: dict, at_least: int) -> None:
    attempts = err.get("attempts")
    check(isinstance(attempts, list), f"`attempts` is a list: {err!r}")
    check(
        len(attempts) >= at_least,
        f"`attempts` lists at least {at_least} attempt(s): {attempts!r}",
    )
    for a in attempts:
        for key in ("target", "model", "status", "reason", "durationMs"):
            check(key in a, f"attempt has `{key}`: {a!r}")
        check(
            isinstance(a["status"], int) and a["status"] >= 500,
            f"attempt status is the upstream 5xx: {a!r}",
        )


# ---------------------------------------------------------------------------------
# OpenAI
# ---------------------------------------------------------------------------------


def openai_unary() -> str:
    raw = openai_client().chat.completions.with_raw_response.create(
        model=OPENAI_MODEL, messages=MESSAGES
    )
    eq(raw.status_code, 200, "status")
    target = raw.headers.get("x-switchback-target")
    check(bool(target), f"x-switchback-target is set: {dict(raw.headers)!r}")
    if OPENAI_TARGET:
        eq(target, OPENAI_TARGET, "x-switchback-target")
    eq(raw.headers.get("x-switchback-attempts"), "1", "x-switchback-attempts")
    eq(raw.headers.get("x-switchback-fallbacks"), "0", "x-switchback-fallbacks")
    completion = raw.parse()
    eq(completion.model, OPENAI_MODEL, "completion.model")
    eq(completion.object, "chat.completion", "completion.object")
    text = completion.choices[0].message.content
    check(bool(text), "the completion has content")
    if OPENAI_TEXT:
        eq(text, OPENAI_TEXT, "content")
    eq(completion.choices[0].finish_reason, "stop", "finish_reason")
    check(completion.usage is not None, "usage is parsed")
    # The SDK exposes x-request-id as `_request_id`; the proxy always sets one.
    request_id = raw.headers.get("x-request-id")
    check(bool(request_id), "x-request-id is set")
    eq(completion._request_id, request_id, "completion._request_id")
    return f"{text!r} via {target}"


def openai_stream() -> str:
    raw = openai_client().chat.completions.with_raw_response.create(
        model=OPENAI_STREAM_MODEL,
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
    )
    eq(raw.status_code, 200, "status")
    check(
        raw.headers.get("content-type", "").startswith("text/event-stream"),
        f"content-type is text/event-stream: {raw.headers.get('content-type')!r}",
    )
    check(bool(raw.headers.get("x-switchback-target")), "x-switchback-target is set")
    pieces: list[str] = []
    chunks = 0
    finish = None
    usage = None
    for chunk in raw.parse():
        chunks += 1
        eq(chunk.model, OPENAI_STREAM_MODEL, f"chunk {chunks} model")
        eq(chunk.object, "chat.completion.chunk", f"chunk {chunks} object")
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
        if chunk.usage is not None:
            usage = chunk.usage
    text = "".join(pieces)
    check(chunks >= 3, f"several chunks arrive: {chunks}")
    check(bool(text), "the stream has content")
    if OPENAI_STREAM_TEXT:
        eq(text, OPENAI_STREAM_TEXT, "assembled stream text")
    eq(finish, "stop", "finish_reason")
    check(usage is not None, "include_usage gives a usage chunk")
    return f"{chunks} chunks, {text!r}"


def openai_fallback() -> str:
    raw = openai_client().chat.completions.with_raw_response.create(
        model=FALLBACK_MODEL, messages=MESSAGES
    )
    eq(raw.status_code, 200, "status")
    eq(raw.headers.get("x-switchback-fallbacks"), "1", "x-switchback-fallbacks")
    target = raw.headers.get("x-switchback-target")
    if FALLBACK_TARGET:
        eq(target, FALLBACK_TARGET, "x-switchback-target")
    completion = raw.parse()
    eq(completion.model, FALLBACK_MODEL, "completion.model")
    if FALLBACK_TEXT:
        eq(completion.choices[0].message.content, FALLBACK_TEXT, "content")
    return f"answered by {target} after {raw.headers.get('x-switchback-attempts')} attempts"


def openai_stream_interrupted() -> str:
    # After the first event is out the proxy cannot fall back; it ends the stream with
    # an error event, which the SDK raises as APIError mid-iteration.
    stream = openai_client().chat.completions.create(
        model=OPENAI_BREAK_MODEL, messages=MESSAGES, stream=True
    )
    pieces: list[str] = []
    try:
        for chunk in stream:
            eq(chunk.model, OPENAI_BREAK_MODEL, "chunk model")
            for choice in chunk.choices:
                if choice.delta.content:
                    pieces.append(choice.delta.content)
    except openai.APIError as e:
        check(
            not isinstance(e, openai.APIStatusError),
            f"an in-stream error is a plain APIError: {type(e).__name__}",
        )
        check(isinstance(e.body, dict), f"e.body is the error object: {e.body!r}")
        eq(e.code, "stream_interrupted", "e.code")
        check(bool(e.message), "the error has a message")
        text = "".join(pieces)
        check(bool(text), "some text arrived before the break")
        if OPENAI_BREAK_TEXT:
            eq(text, OPENAI_BREAK_TEXT, "text before the break")
        return f"{type(e).__name__} {e.code} after {text!r}"
    raise CheckFailed(f"the stream ended without an error after {''.join(pieces)!r}")


def openai_all_failed() -> str:
    try:
        openai_client().chat.completions.create(model=FAILING_MODEL, messages=MESSAGES)
    except openai.APIStatusError as e:
        check(
            isinstance(e, openai.InternalServerError),
            f"a 5xx raises InternalServerError, got {type(e).__name__}",
        )
        eq(e.status_code, 502, "status_code")
        # The SDK hands over the `error` object as `body` and lifts `code`/`type`.
        check(isinstance(e.body, dict), f"e.body is the parsed error object: {e.body!r}")
        eq(e.body.get("code"), "all_providers_failed", "e.body['code']")
        eq(e.code, "all_providers_failed", "e.code")
        eq(e.type, "server_error", "e.type")
        check(bool(e.body.get("message")), "the error has a message")
        check_attempts(e.body, FAILING_TARGETS)
        err = error_object(e)
        eq(err.get("code"), "all_providers_failed", "response.json()['error']['code']")
        check_attempts(err, FAILING_TARGETS)
        check(e.request_id is not None, "x-request-id reaches e.request_id")
        return f"{type(e).__name__} {e.status_code} {e.code}, {len(err['attempts'])} attempts"
    raise CheckFailed("no exception raised for a route whose targets all fail")


def openai_unknown_model() -> str:
    try:
        openai_client().chat.completions.create(model=UNKNOWN_MODEL, messages=MESSAGES)
    except openai.APIStatusError as e:
        check(
            isinstance(e, openai.NotFoundError),
            f"a 404 raises NotFoundError, got {type(e).__name__} {e.status_code}",
        )
        eq(e.status_code, 404, "status_code")
        eq(e.code, "model_not_found", "e.code")
        eq(error_object(e).get("code"), "model_not_found", "response code")
        return f"{type(e).__name__} {e.code}"
    raise CheckFailed("no exception raised for an unknown model")


def openai_embeddings() -> str:
    raw = openai_client().embeddings.with_raw_response.create(
        model=EMBEDDING_MODEL, input=["one", "two"]
    )
    eq(raw.status_code, 200, "status")
    check(bool(raw.headers.get("x-switchback-target")), "x-switchback-target is set")
    result = raw.parse()
    eq(result.model, EMBEDDING_MODEL, "embeddings model")
    eq(len(result.data), 2, "one embedding per input")
    eq([d.index for d in result.data], [0, 1], "indices")
    dims = {len(d.embedding) for d in result.data}
    check(len(dims) == 1 and dims.pop() > 0, "embeddings are non-empty floats")
    check(all(isinstance(x, float) for x in result.data[0].embedding), "floats")
    return f"{len(result.data)} vectors of {len(result.data[0].embedding)}"


def openai_models() -> str:
    page = openai_client().models.list()
    ids = [m.id for m in page]
    for want in (OPENAI_MODEL, OPENAI_STREAM_MODEL, FALLBACK_MODEL, EMBEDDING_MODEL, ANTHROPIC_MODEL):
        check(want in ids, f"{want!r} is listed: {ids!r}")
    check(UNKNOWN_MODEL not in ids, "the unknown model is not listed")
    check(all(m.object == "model" for m in page.data), "every entry is a model object")
    return f"{len(ids)} models"


# ---------------------------------------------------------------------------------
# Anthropic
# ---------------------------------------------------------------------------------


def anthropic_unary() -> str:
    raw = anthropic_client().messages.with_raw_response.create(
        model=ANTHROPIC_MODEL, max_tokens=64, messages=MESSAGES
    )
    eq(raw.status_code, 200, "status")
    check(bool(raw.headers.get("x-switchback-target")), "x-switchback-target is set")
    message = raw.parse()
    eq(message.model, ANTHROPIC_MODEL, "message.model")
    eq(message.type, "message", "message.type")
    eq(message.role, "assistant", "message.role")
    check(len(message.content) >= 1, "the message has content blocks")
    eq(message.content[0].type, "text", "first block type")
    text = message.content[0].text
    check(bool(text), "the text block is not empty")
    if ANTHROPIC_TEXT:
        eq(text, ANTHROPIC_TEXT, "text")
    eq(message.stop_reason, "end_turn", "stop_reason")
    check(message.usage.input_tokens > 0, "usage is parsed")
    return repr(text)


def anthropic_stream() -> str:
    with anthropic_client().messages.stream(
        model=ANTHROPIC_STREAM_MODEL, max_tokens=64, messages=MESSAGES
    ) as stream:
        eq(stream.response.status_code, 200, "status")
        check(
            bool(stream.response.headers.get("x-switchback-target")),
            "x-switchback-target is set",
        )
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    check(bool(text), "the stream has text")
    if ANTHROPIC_STREAM_TEXT:
        eq(text, ANTHROPIC_STREAM_TEXT, "assembled text_stream")
    eq(final.model, ANTHROPIC_STREAM_MODEL, "final message model")
    eq(final.content[0].text, text, "final message text")
    eq(final.stop_reason, "end_turn", "final stop_reason")
    return f"{text!r}"


def anthropic_stream_overloaded_first() -> str:
    # Anthropic-style overload: 200 then `event: error` first. The proxy holds the first
    # event back, sees the error and falls back; the SDK sees one clean stream.
    with anthropic_client().messages.stream(
        model=ANTHROPIC_OVERLOADED_MODEL, max_tokens=64, messages=MESSAGES
    ) as stream:
        eq(stream.response.status_code, 200, "status")
        eq(stream.response.headers.get("x-switchback-fallbacks"), "1", "x-switchback-fallbacks")
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    if ANTHROPIC_OVERLOADED_TEXT:
        eq(text, ANTHROPIC_OVERLOADED_TEXT, "assembled text_stream")
    eq(final.model, ANTHROPIC_OVERLOADED_MODEL, "final message model")
    return f"fell back, {text!r}"


def anthropic_stream_interrupted() -> str:
    pieces: list[str] = []
    try:
        with anthropic_client().messages.stream(
            model=ANTHROPIC_BREAK_MODEL, max_tokens=64, messages=MESSAGES
        ) as stream:
            for piece in stream.text_stream:
                pieces.append(piece)
    except anthropic.APIStatusError as e:
        # Raised from an `event: error` inside a 200 stream, not from an HTTP status.
        eq(e.status_code, 200, "status of the stream the error arrived in")
        body = e.body
        check(isinstance(body, dict), f"e.body is the parsed error event: {body!r}")
        eq(body.get("type"), "error", "event body type")
        check(
            isinstance(body.get("error"), dict) and bool(body["error"].get("type")),
            f"event body has error.type: {body!r}",
        )
        text = "".join(pieces)
        check(bool(text), "some text arrived before the break")
        if ANTHROPIC_BREAK_TEXT:
            eq(text, ANTHROPIC_BREAK_TEXT, "text before the break")
        return f"{type(e).__name__} {body['error']['type']} after {text!r}"
    raise CheckFailed(f"the stream ended without an error after {''.join(pieces)!r}")


def openai_wrong_key() -> str:
    try:
        openai_client(WRONG_KEY).chat.completions.create(model=OPENAI_MODEL, messages=MESSAGES)
    except openai.APIStatusError as e:
        check(
            isinstance(e, openai.AuthenticationError),
            f"a 401 raises AuthenticationError, got {type(e).__name__} {e.status_code}",
        )
        eq(e.status_code, 401, "status_code")
        eq(e.code, "invalid_api_key", "e.code")
        eq(error_object(e).get("type"), "invalid_request_error", "error.type")
        return f"{type(e).__name__} {e.code}"
    raise CheckFailed("no exception raised for a wrong key")


def openai_forbidden_model() -> str:
    if not FORBIDDEN_MODEL:
        return "skipped (SWITCHBACK_FORBIDDEN_MODEL unset)"
    try:
        openai_client().chat.completions.create(model=FORBIDDEN_MODEL, messages=MESSAGES)
    except openai.APIStatusError as e:
        check(
            isinstance(e, openai.NotFoundError),
            f"a forbidden route raises NotFoundError, got {type(e).__name__} {e.status_code}",
        )
        eq(e.code, "model_not_found", "e.code")
        ids = [m.id for m in openai_client().models.list()]
        check(FORBIDDEN_MODEL not in ids, "the forbidden model is not listed")
        return f"{type(e).__name__} {e.code}"
    raise CheckFailed("no exception raised for a route the client may not call")


def anthropic_wrong_key() -> str:
    try:
        anthropic_client(WRONG_KEY).messages.create(
            model=ANTHROPIC_MODEL, max_tokens=64, messages=MESSAGES
        )
    except anthropic.APIStatusError as e:
        check(
            isinstance(e, anthropic.AuthenticationError),
            f"a 401 raises AuthenticationError, got {type(e).__name__} {e.status_code}",
        )
        eq(e.status_code, 401, "status_code")
        body = e.response.json()
        eq(body.get("type"), "error", "body type")
        eq(body["error"].get("type"), "authentication_error", "error.type")
        return f"{type(e).__name__} {body['error']['type']}"
    raise CheckFailed("no exception raised for a wrong key")


def anthropic_unknown_model() -> str:
    try:
        anthropic_client().messages.create(
            model=UNKNOWN_MODEL, max_tokens=64, messages=MESSAGES
        )
    except anthropic.APIStatusError as e:
        check(
            isinstance(e, anthropic.NotFoundError),
            f"a 404 raises NotFoundError, got {type(e).__name__} {e.status_code}",
        )
        eq(e.status_code, 404, "status_code")
        body = e.response.json()
        eq(body.get("type"), "error", "body type")
        eq(body["error"].get("type"), "not_found_error", "error.type")
        eq(body["error"].get("code"), "model_not_found", "error.code")
        return f"{type(e).__name__} {body['error']['type']}"
    raise CheckFailed("no exception raised for an unknown model")


def anthropic_all_failed() -> str:
    try:
        anthropic_client().messages.create(
            model=ANTHROPIC_FAILING_MODEL, max_tokens=64, messages=MESSAGES
        )
    except anthropic.APIStatusError as e:
        check(e.status_code in (502, 503), f"status is 502 or 503: {e.status_code}")
        check(
            isinstance(e, anthropic.InternalServerError),
            f"a 5xx raises an InternalServerError subclass, got {type(e).__name__}",
        )
        body = e.response.json()
        eq(body.get("type"), "error", "body type")
        err = body.get("error")
        check(isinstance(err, dict), f"body has an `error` object: {body!r}")
        check(bool(err.get("type")) and bool(err.get("message")), f"error type and message: {err!r}")
        check(
            err.get("code") in ("all_providers_failed", "no_available_target"),
            f"error.code: {err.get('code')!r}",
        )
        check_attempts(err, 1)
        # The SDK keeps the parsed body as `e.body` too.
        check(isinstance(e.body, dict), f"e.body is parsed: {e.body!r}")
        return f"{type(e).__name__} {e.status_code} {err['code']}"
    raise CheckFailed("no exception raised for a route whose targets all fail")


def anthropic_stream_all_failed() -> str:
    # A stream that fails before its first event is an ordinary error response.
    try:
        with anthropic_client().messages.stream(
            model=ANTHROPIC_FAILING_MODEL, max_tokens=64, messages=MESSAGES
        ) as stream:
            "".join(stream.text_stream)
    except anthropic.APIStatusError as e:
        check(e.status_code in (502, 503), f"status is 502 or 503: {e.status_code}")
        return f"{type(e).__name__} {e.status_code}"
    raise CheckFailed("no exception raised for a failing stream")


def anthropic_models() -> str:
    ids = [m.id for m in anthropic_client().models.list()]
    for want in (ANTHROPIC_MODEL, ANTHROPIC_STREAM_MODEL, OPENAI_MODEL):
        check(want in ids, f"{want!r} is listed: {ids!r}")
    return f"{len(ids)} models"


# ---------------------------------------------------------------------------------
# Across providers: an OpenAI-SDK client answered by Anthropic targets and the reverse
# ---------------------------------------------------------------------------------


def openai_x_unary() -> str:
    raw = openai_client().chat.completions.with_raw_response.create(
        model=OPENAI_X_MODEL,
        messages=[{"role": "system", "content": SYSTEM}, *MESSAGES],
        max_tokens=100,
        temperature=0.5,
        stop=["END"],
    )
    eq(raw.status_code, 200, "status")
    target = raw.headers.get("x-switchback-target")
    if OPENAI_X_TARGET:
        eq(target, OPENAI_X_TARGET, "x-switchback-target")
    eq(raw.headers.get("x-switchback-fallbacks"), "0", "x-switchback-fallbacks")
    check(bool(raw.headers.get("x-request-id")), "x-request-id is set")
    body = raw.http_response.json()
    for key in ("id", "object", "created", "model", "choices", "usage"):
        check(key in body, f"the raw body has `{key}`: {body!r}")
    completion = raw.parse()
    eq(completion.object, "chat.completion", "completion.object")
    eq(completion.model, OPENAI_X_MODEL, "completion.model (the client's name)")
    check(completion.id.startswith("chatcmpl-"), f"an OpenAI-style id: {completion.id!r}")
    check(isinstance(completion.created, int) and completion.created > 0, "created")
    eq(len(completion.choices), 1, "one choice")
    choice = completion.choices[0]
    eq(choice.index, 0, "choice index")
    eq(choice.message.role, "assistant", "role")
    if OPENAI_X_TEXT:
        eq(choice.message.content, OPENAI_X_TEXT, "content")
    check(not choice.message.tool_calls, f"no tool calls: {choice.message.tool_calls!r}")
    eq(choice.finish_reason, "stop", "finish_reason (end_turn)")
    usage = completion.usage
    check(usage is not None, "usage is parsed")
    check(usage.prompt_tokens > 0 and usage.completion_tokens > 0, f"usage counts: {usage!r}")
    eq(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens, "total_tokens")
    return f"{choice.message.content!r} via {target}"


def openai_x_stream() -> str:
    stream = openai_client().chat.completions.create(
        model=OPENAI_X_STREAM_MODEL,
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces: list[str] = []
    ids: set[str] = set()
    finish = None
    usage = None
    chunks = 0
    first_role = None
    for chunk in stream:
        chunks += 1
        ids.add(chunk.id)
        eq(chunk.object, "chat.completion.chunk", f"chunk {chunks} object")
        eq(chunk.model, OPENAI_X_STREAM_MODEL, f"chunk {chunks} model")
        for choice in chunk.choices:
            if chunks == 1:
                first_role = choice.delta.role
            check(not choice.delta.tool_calls, "no tool call deltas")
            if choice.delta.content:
                check(finish is None, "no content after the finish chunk")
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
        if chunk.usage is not None:
            check(finish is not None, "usage comes after the finish chunk")
            eq(chunk.choices, [], "the usage chunk has no choices")
            usage = chunk.usage
    text = "".join(pieces)
    eq(first_role, "assistant", "the first chunk carries the role")
    eq(len(ids), 1, f"one id for every chunk: {ids!r}")
    check(ids.pop().startswith("chatcmpl-"), "an OpenAI-style id")
    check(len(pieces) >= 3, f"the text arrives in several deltas: {pieces!r}")
    if OPENAI_X_STREAM_TEXT:
        eq(text, OPENAI_X_STREAM_TEXT, "assembled stream text")
    eq(finish, "stop", "finish_reason")
    check(usage is not None, "include_usage gives a usage chunk")
    check(usage.prompt_tokens > 0, f"prompt tokens reported: {usage!r}")
    eq(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens, "total_tokens")
    return f"{chunks} chunks, {text!r}"


def check_openai_tool_call(call: Any, what: str) -> None:
    eq(call.type, "function", f"{what} type")
    if OPENAI_X_TOOL_ID:
        eq(call.id, OPENAI_X_TOOL_ID, f"{what} id")
    check(bool(call.id), f"{what} has an id")
    eq(call.function.name, TOOL_NAME, f"{what} name")
    check(isinstance(call.function.arguments, str), f"{what} arguments are a JSON string")
    try:
        args = json.loads(call.function.arguments)
    except ValueError as e:
        raise CheckFailed(f"{what} arguments do not parse: {call.function.arguments!r}: {e}")
    check(isinstance(args, dict), f"{what} arguments are an object: {args!r}")
    if TOOL_ARGS is not None:
        eq(args, TOOL_ARGS, f"{what} arguments")


def openai_x_tool_round_trip() -> str:
    client = openai_client()
    messages: list[Any] = [{"role": "user", "content": WEATHER_QUESTION}]
    first = client.chat.completions.create(
        model=OPENAI_X_TOOLS_MODEL, messages=messages, tools=OPENAI_TOOLS, tool_choice="auto"
    )
    eq(first.model, OPENAI_X_TOOLS_MODEL, "completion.model")
    choice = first.choices[0]
    eq(choice.finish_reason, "tool_calls", "finish_reason (tool_use)")
    calls = choice.message.tool_calls
    check(calls is not None and len(calls) == 1, f"one tool call: {calls!r}")
    check_openai_tool_call(calls[0], "tool call")
    check(not choice.message.content, f"no text beside the call: {choice.message.content!r}")
    # The usual agent loop: append the assistant message as the SDK returned it, then
    # the tool's answer.
    messages.append(choice.message)
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": TOOL_RESULT})
    second = client.chat.completions.create(
        model=OPENAI_X_TOOLS_MODEL, messages=messages, tools=OPENAI_TOOLS
    )
    eq(second.choices[0].finish_reason, "stop", "finish_reason after the result")
    check(not second.choices[0].message.tool_calls, "no further tool call")
    if OPENAI_X_TOOLS_TEXT:
        eq(second.choices[0].message.content, OPENAI_X_TOOLS_TEXT, "answer after the result")
    return f"{calls[0].function.name}({calls[0].function.arguments}) -> {second.choices[0].message.content!r}"


def openai_x_tool_stream_round_trip() -> str:
    client = openai_client()
    messages: list[Any] = [{"role": "user", "content": WEATHER_QUESTION}]
    stream = client.chat.completions.create(
        model=OPENAI_X_TOOLS_MODEL,
        messages=messages,
        tools=OPENAI_TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    fragments = 0
    finish = None
    for chunk in stream:
        eq(chunk.model, OPENAI_X_TOOLS_MODEL, "chunk model")
        for choice in chunk.choices:
            if choice.delta.content:
                check(not calls, "text comes before the tool call")
                text.append(choice.delta.content)
            for d in choice.delta.tool_calls or []:
                check(isinstance(d.index, int), f"a tool call delta has an index: {d!r}")
                call = calls.get(d.index)
                if call is None:
                    # The first delta of a call names it.
                    check(bool(d.id), f"the first delta has the id: {d!r}")
                    eq(d.type, "function", "first delta type")
                    check(d.function is not None and bool(d.function.name), f"first delta has the name: {d!r}")
                    call = calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
                else:
                    check(not d.id, f"the id comes once: {d!r}")
                if d.function is not None and d.function.arguments:
                    fragments += 1
                    call["arguments"] += d.function.arguments
            if choice.finish_reason:
                finish = choice.finish_reason
    eq(finish, "tool_calls", "finish_reason")
    eq(sorted(calls), [0], "one tool call, index 0")
    call = calls[0]
    check(fragments >= 2, f"the arguments arrive in fragments: {fragments}")
    if OPENAI_X_TOOLS_PREAMBLE:
        eq("".join(text), OPENAI_X_TOOLS_PREAMBLE, "text before the call")
    if OPENAI_X_TOOL_ID:
        eq(call["id"], OPENAI_X_TOOL_ID, "tool call id")
    eq(call["name"], TOOL_NAME, "tool name")
    args = json.loads(call["arguments"])
    if TOOL_ARGS is not None:
        eq(args, TOOL_ARGS, "reassembled arguments")
    messages.append(
        {
            "role": "assistant",
            "content": "".join(text) or None,
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
            ],
        }
    )
    messages.append({"role": "tool", "tool_call_id": call["id"], "content": TOOL_RESULT})
    answer = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=OPENAI_X_TOOLS_MODEL, messages=messages, tools=OPENAI_TOOLS, stream=True
        )
        if c.choices
    )
    if OPENAI_X_TOOLS_TEXT:
        eq(answer, OPENAI_X_TOOLS_TEXT, "streamed answer after the result")
    return f"{''.join(text)!r} + {call['name']}({call['arguments']}) in {fragments} fragments -> {answer!r}"


def openai_x_fallback() -> str:
    client = openai_client()
    raw = client.chat.completions.with_raw_response.create(
        model=OPENAI_X_FALLBACK_MODEL, messages=MESSAGES
    )
    eq(raw.status_code, 200, "status")
    eq(raw.headers.get("x-switchback-fallbacks"), "1", "x-switchback-fallbacks")
    target = raw.headers.get("x-switchback-target")
    if OPENAI_X_FALLBACK_TARGET:
        eq(target, OPENAI_X_FALLBACK_TARGET, "x-switchback-target (the Anthropic target)")
    check(raw.headers.get("content-type", "").startswith("application/json"), "JSON")
    completion = raw.parse()
    eq(completion.object, "chat.completion", "completion.object")
    eq(completion.model, OPENAI_X_FALLBACK_MODEL, "completion.model")
    check(completion.id.startswith("chatcmpl-"), f"an OpenAI-style id: {completion.id!r}")
    eq(completion.choices[0].finish_reason, "stop", "finish_reason")
    if OPENAI_X_FALLBACK_TEXT:
        eq(completion.choices[0].message.content, OPENAI_X_FALLBACK_TEXT, "content")
    # The same route streamed: the first target fails before any event, the stream
    # comes from the Anthropic target as ordinary chat.completion.chunk events.
    raw_stream = client.chat.completions.with_raw_response.create(
        model=OPENAI_X_FALLBACK_MODEL, messages=MESSAGES, stream=True
    )
    eq(raw_stream.headers.get("x-switchback-fallbacks"), "1", "stream x-switchback-fallbacks")
    if OPENAI_X_FALLBACK_TARGET:
        eq(raw_stream.headers.get("x-switchback-target"), OPENAI_X_FALLBACK_TARGET, "stream target")
    pieces: list[str] = []
    finish = None
    for chunk in raw_stream.parse():
        eq(chunk.object, "chat.completion.chunk", "chunk object")
        eq(chunk.model, OPENAI_X_FALLBACK_MODEL, "chunk model")
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    eq(finish, "stop", "stream finish_reason")
    if OPENAI_X_FALLBACK_TEXT:
        eq("".join(pieces), OPENAI_X_FALLBACK_TEXT, "stream text")
    return f"answered by {target} after {raw.headers.get('x-switchback-attempts')} attempts"


def anthropic_x_unary() -> str:
    raw = anthropic_client().messages.with_raw_response.create(
        model=ANTHROPIC_X_MODEL,
        max_tokens=64,
        system=SYSTEM,
        messages=MESSAGES,
        stop_sequences=["END"],
    )
    eq(raw.status_code, 200, "status")
    target = raw.headers.get("x-switchback-target")
    if ANTHROPIC_X_TARGET:
        eq(target, ANTHROPIC_X_TARGET, "x-switchback-target")
    eq(raw.headers.get("x-switchback-fallbacks"), "0", "x-switchback-fallbacks")
    message = raw.parse()
    eq(message.type, "message", "message.type")
    eq(message.role, "assistant", "message.role")
    eq(message.model, ANTHROPIC_X_MODEL, "message.model (the client's name)")
    check(message.id.startswith("msg_"), f"an Anthropic-style id: {message.id!r}")
    eq([b.type for b in message.content], ["text"], "content block types")
    if ANTHROPIC_X_TEXT:
        eq(message.content[0].text, ANTHROPIC_X_TEXT, "text")
    eq(message.stop_reason, "end_turn", "stop_reason (stop)")
    eq(message.stop_sequence, None, "stop_sequence")
    check(message.usage.input_tokens > 0 and message.usage.output_tokens > 0, f"usage: {message.usage!r}")
    return f"{message.content[0].text!r} via {target}"


def anthropic_x_stream() -> str:
    events: list[str] = []
    with anthropic_client().messages.stream(
        model=ANTHROPIC_X_STREAM_MODEL, max_tokens=64, messages=MESSAGES
    ) as stream:
        eq(stream.response.status_code, 200, "status")
        eq(stream.response.headers.get("content-type", "").split(";")[0], "text/event-stream", "content-type")
        pieces: list[str] = []
        for event in stream:
            events.append(event.type)
            if event.type == "text":
                pieces.append(event.text)
        final = stream.get_final_message()
    text = "".join(pieces)
    eq(events[0], "message_start", "first event")
    check("content_block_start" in events and "content_block_stop" in events, f"block events: {events!r}")
    eq(events[-1], "message_stop", "last event")
    check(len(pieces) >= 3, f"the text arrives in several deltas: {pieces!r}")
    if ANTHROPIC_X_STREAM_TEXT:
        eq(text, ANTHROPIC_X_STREAM_TEXT, "assembled text")
    eq(final.model, ANTHROPIC_X_STREAM_MODEL, "final message model")
    check(final.id.startswith("msg_"), f"an Anthropic-style id: {final.id!r}")
    eq([b.type for b in final.content], ["text"], "final content block types")
    eq(final.content[0].text, text, "final message text")
    eq(final.stop_reason, "end_turn", "final stop_reason")
    check(final.usage.output_tokens > 0, f"output tokens: {final.usage!r}")
    check(final.usage.input_tokens > 0, f"input tokens reach the final message: {final.usage!r}")
    return f"{len(events)} events, {text!r}"


def check_anthropic_tool_use(block: Any, what: str) -> None:
    eq(block.type, "tool_use", f"{what} type")
    if ANTHROPIC_X_TOOL_ID:
        eq(block.id, ANTHROPIC_X_TOOL_ID, f"{what} id")
    check(bool(block.id), f"{what} has an id")
    eq(block.name, TOOL_NAME, f"{what} name")
    check(isinstance(block.input, dict), f"{what} input is an object: {block.input!r}")
    if TOOL_ARGS is not None:
        eq(block.input, TOOL_ARGS, f"{what} input")


def anthropic_x_tool_round_trip() -> str:
    client = anthropic_client()
    messages: list[Any] = [{"role": "user", "content": WEATHER_QUESTION}]
    first = client.messages.create(
        model=ANTHROPIC_X_TOOLS_MODEL,
        max_tokens=256,
        messages=messages,
        tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "auto"},
    )
    eq(first.model, ANTHROPIC_X_TOOLS_MODEL, "message.model")
    eq(first.stop_reason, "tool_use", "stop_reason (tool_calls)")
    eq([b.type for b in first.content], ["tool_use"], "content block types")
    block = first.content[0]
    check_anthropic_tool_use(block, "tool_use block")
    messages.append({"role": "assistant", "content": first.content})
    messages.append(
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": block.id, "content": TOOL_RESULT}],
        }
    )
    second = client.messages.create(
        model=ANTHROPIC_X_TOOLS_MODEL, max_tokens=256, messages=messages, tools=ANTHROPIC_TOOLS
    )
    eq(second.stop_reason, "end_turn", "stop_reason after the result")
    eq([b.type for b in second.content], ["text"], "answer block types")
    if ANTHROPIC_X_TOOLS_TEXT:
        eq(second.content[0].text, ANTHROPIC_X_TOOLS_TEXT, "answer after the result")
    return f"{block.name}({json.dumps(block.input)}) -> {second.content[0].text!r}"


def anthropic_x_tool_stream_round_trip() -> str:
    client = anthropic_client()
    messages: list[Any] = [{"role": "user", "content": WEATHER_QUESTION}]
    partial: list[str] = []
    starts: list[tuple[int, str]] = []
    with client.messages.stream(
        model=ANTHROPIC_X_TOOLS_MODEL, max_tokens=256, messages=messages, tools=ANTHROPIC_TOOLS
    ) as stream:
        for event in stream:
            if event.type == "content_block_start":
                starts.append((event.index, event.content_block.type))
            elif event.type == "input_json":
                partial.append(event.partial_json)
        final = stream.get_final_message()
    eq(final.model, ANTHROPIC_X_TOOLS_MODEL, "final message model")
    eq(final.stop_reason, "tool_use", "final stop_reason")
    want_types = (["text"] if ANTHROPIC_X_TOOLS_PREAMBLE else []) + ["tool_use"]
    eq([b.type for b in final.content], want_types, "final content block types")
    eq(starts, list(enumerate(want_types)), "content_block_start (index, type)")
    if ANTHROPIC_X_TOOLS_PREAMBLE:
        eq(final.content[0].text, ANTHROPIC_X_TOOLS_PREAMBLE, "text before the call")
    block = final.content[-1]
    check_anthropic_tool_use(block, "streamed tool_use block")
    check(len([p for p in partial if p]) >= 2, f"the input arrives in fragments: {partial!r}")
    eq(json.loads("".join(partial)), block.input, "partial_json joins to the input")
    messages.append({"role": "assistant", "content": final.content})
    messages.append(
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": block.id,
                    "content": [{"type": "text", "text": TOOL_RESULT}],
                }
            ],
        }
    )
    with client.messages.stream(
        model=ANTHROPIC_X_TOOLS_MODEL, max_tokens=256, messages=messages, tools=ANTHROPIC_TOOLS
    ) as stream:
        answer = "".join(stream.text_stream)
        after = stream.get_final_message()
    eq(after.stop_reason, "end_turn", "stop_reason after the result")
    if ANTHROPIC_X_TOOLS_TEXT:
        eq(answer, ANTHROPIC_X_TOOLS_TEXT, "streamed answer after the result")
    return f"{starts!r} {block.name}({json.dumps(block.input)}) in {len(partial)} fragments -> {answer!r}"


def openai_chain_unary() -> str:
    raw = openai_client().chat.completions.with_raw_response.create(
        model=CHAIN_MODEL, messages=MESSAGES
    )
    eq(raw.status_code, 200, "status")
    eq(raw.headers.get("x-switchback-fallbacks"), "2", "x-switchback-fallbacks")
    target = raw.headers.get("x-switchback-target")
    if CHAIN_TARGET:
        eq(target, CHAIN_TARGET, "x-switchback-target")
    completion = raw.parse()
    eq(completion.model, CHAIN_MODEL, "completion.model")
    if CHAIN_TEXT:
        eq(completion.choices[0].message.content, CHAIN_TEXT, "content")
    return f"azure-openai 429 -> gemini 503 -> answered by {target}"


def openai_chain_stream() -> str:
    raw = openai_client().chat.completions.with_raw_response.create(
        model=CHAIN_MODEL, messages=MESSAGES, stream=True
    )
    eq(raw.status_code, 200, "status")
    eq(raw.headers.get("x-switchback-fallbacks"), "2", "x-switchback-fallbacks")
    target = raw.headers.get("x-switchback-target")
    if CHAIN_TARGET:
        eq(target, CHAIN_TARGET, "x-switchback-target")
    pieces = []
    for chunk in raw.parse():
        eq(chunk.model, CHAIN_MODEL, "chunk.model")
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    text = "".join(pieces)
    check(bool(text), "the stream has content")
    if CHAIN_TEXT:
        eq(text, CHAIN_TEXT, "assembled stream text")
    return f"streamed by {target} after two providers failed"


def anthropic_cloud_chain_unary() -> str:
    raw = anthropic_client().messages.with_raw_response.create(
        model=CLOUD_MODEL, max_tokens=64, messages=MESSAGES
    )
    eq(raw.status_code, 200, "status")
    eq(raw.headers.get("x-switchback-fallbacks"), "2", "x-switchback-fallbacks")
    target = raw.headers.get("x-switchback-target")
    if CLOUD_TARGET:
        eq(target, CLOUD_TARGET, "x-switchback-target")
    message = raw.parse()
    eq(message.type, "message", "message.type")
    eq(message.model, CLOUD_MODEL, "message.model (the client's name)")
    if CLOUD_TEXT:
        eq(message.content[0].text, CLOUD_TEXT, "text")
    eq(message.stop_reason, "end_turn", "stop_reason")
    check(message.usage.input_tokens > 0, f"usage: {message.usage!r}")
    return f"azure-openai 429 -> bedrock throttled -> answered by {target}"


def anthropic_cloud_chain_stream() -> str:
    events: list[str] = []
    with anthropic_client().messages.stream(
        model=CLOUD_MODEL, max_tokens=64, messages=MESSAGES
    ) as stream:
        eq(stream.response.status_code, 200, "status")
        target = stream.response.headers.get("x-switchback-target")
        if CLOUD_TARGET:
            eq(target, CLOUD_TARGET, "x-switchback-target")
        pieces: list[str] = []
        for event in stream:
            events.append(event.type)
            if event.type == "text":
                pieces.append(event.text)
        final = stream.get_final_message()
    eq(events[0], "message_start", "first event")
    eq(events[-1], "message_stop", "last event")
    text = "".join(pieces)
    check(bool(text), "the stream has content")
    if CLOUD_TEXT:
        eq(text, CLOUD_TEXT, "assembled stream text")
    eq(final.model, CLOUD_MODEL, "final message model")
    return f"streamed by {target} after azure and bedrock failed"


def openai_responses_unary() -> str:
    raw = openai_client().responses.with_raw_response.create(
        model=RESPONSES_MODEL, input="hello"
    )
    eq(raw.status_code, 200, "status")
    # The Anthropic target is skipped (unsupportedSurface), the 429 moved past.
    eq(raw.headers.get("x-switchback-fallbacks"), "2", "x-switchback-fallbacks")
    target = raw.headers.get("x-switchback-target")
    if RESPONSES_TARGET:
        eq(target, RESPONSES_TARGET, "x-switchback-target")
    response = raw.parse()
    eq(response.model, RESPONSES_MODEL, "response.model")
    eq(response.status, "completed", "response.status")
    if RESPONSES_TEXT:
        eq(response.output_text, RESPONSES_TEXT, "response.output_text")
    return f"answered by {target}, {response.usage.output_tokens} output tokens"


def openai_responses_stream() -> str:
    raw = openai_client().responses.with_raw_response.create(
        model=RESPONSES_MODEL, input="hello", stream=True
    )
    eq(raw.status_code, 200, "status")
    eq(raw.headers.get("x-switchback-fallbacks"), "2", "x-switchback-fallbacks")
    target = raw.headers.get("x-switchback-target")
    if RESPONSES_TARGET:
        eq(target, RESPONSES_TARGET, "x-switchback-target")
    deltas, completed, kinds = [], None, []
    for event in raw.parse():
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type == "response.completed":
            completed = event.response
    eq(kinds[0], "response.created", "first event")
    check(completed is not None, f"a response.completed event among {kinds!r}")
    eq(completed.model, RESPONSES_MODEL, "completed response.model")
    text = "".join(deltas)
    if RESPONSES_TEXT:
        eq(text, RESPONSES_TEXT, "assembled output_text deltas")
    eq(completed.output_text, text, "completed output_text")
    return f"{len(kinds)} events from {target}"


CASES: list[tuple[str, Callable[[], str]]] = [
    ("openai unary chat completion", openai_unary),
    ("openai streaming chat completion", openai_stream),
    ("openai stream interrupted after commit", openai_stream_interrupted),
    ("openai fallback after a 503", openai_fallback),
    ("openai all targets failing -> 502", openai_all_failed),
    ("openai unknown model -> 404", openai_unknown_model),
    ("openai wrong api_key -> 401", openai_wrong_key),
    ("openai route of another namespace -> 404", openai_forbidden_model),
    ("openai embeddings", openai_embeddings),
    ("openai models.list", openai_models),
    ("anthropic unary messages.create", anthropic_unary),
    ("anthropic messages.stream", anthropic_stream),
    ("anthropic stream, overloaded first event -> fallback", anthropic_stream_overloaded_first),
    ("anthropic stream interrupted after commit", anthropic_stream_interrupted),
    ("anthropic unknown model -> 404", anthropic_unknown_model),
    ("anthropic wrong api_key -> 401", anthropic_wrong_key),
    ("anthropic all targets failing", anthropic_all_failed),
    ("anthropic stream, all targets failing", anthropic_stream_all_failed),
    ("anthropic models.list", anthropic_models),
    ("openai sdk -> anthropic target: unary", openai_x_unary),
    ("openai sdk -> anthropic target: stream", openai_x_stream),
    ("openai sdk -> anthropic target: tool call round trip", openai_x_tool_round_trip),
    ("openai sdk -> anthropic target: streamed tool call round trip", openai_x_tool_stream_round_trip),
    ("openai sdk: fallback from an openai to an anthropic target", openai_x_fallback),
    ("openai sdk: azure-openai 429 -> gemini 503 -> anthropic, unary", openai_chain_unary),
    ("openai sdk: azure-openai 429 -> gemini 503 -> anthropic, stream", openai_chain_stream),
    ("anthropic sdk: azure-openai 429 -> bedrock throttled -> claude on vertex, unary", anthropic_cloud_chain_unary),
    ("anthropic sdk: azure-openai 429 -> bedrock throttled -> claude on vertex, stream", anthropic_cloud_chain_stream),
    ("openai responses.create past a skipped and a 429 target", openai_responses_unary),
    ("openai responses.create stream past a skipped and a 429 target", openai_responses_stream),
    ("anthropic sdk -> openai target: unary", anthropic_x_unary),
    ("anthropic sdk -> openai target: messages.stream", anthropic_x_stream),
    ("anthropic sdk -> openai target: tool use round trip", anthropic_x_tool_round_trip),
    ("anthropic sdk -> openai target: streamed tool use round trip", anthropic_x_tool_stream_round_trip),
]


def main() -> int:
    if not URL:
        print("SWITCHBACK_URL is not set (e.g. http://127.0.0.1:8080)", file=sys.stderr)
        return 2
    print(f"openai {openai.__version__}, anthropic {anthropic.__version__}, proxy {URL}")
    only = set(filter(None, os.environ.get("SWITCHBACK_SDK_CASES", "").split(",")))
    passed = failed = 0
    for name, case in CASES:
        if only and name not in only:
            continue
        try:
            detail = case()
        except CheckFailed as e:
            failed += 1
            print(f"FAIL {name}: {e}")
        except Exception as e:  # noqa: BLE001  (an SDK exception is a failure too)
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
            response = getattr(e, "response", None)
            if response is not None:
                print(f"     response {response.status_code} {dict(response.headers)!r}")
                try:
                    print(f"     body {response.text!r}")
                except Exception:  # noqa: BLE001  (a streamed body may be unread)
                    pass
            traceback.print_exc(file=sys.stderr)
        else:
            passed += 1
            print(f"ok   {name}: {detail}")
        sys.stdout.flush()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
