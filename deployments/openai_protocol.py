"""OpenAI-compatible request and response models for /v1/completions and /v1/chat/completions.

Requests are validated strictly (a string is not a number, NaN/Infinity are rejected) and unknown fields are ignored,
as OpenAI does. Extra fields beyond OpenAI's (as in vLLM): top_k, ignore_eos, stop_token_ids and `speculation`
(off | fixed:K | threshold:C | adaptive, optionally +lookup). Fields we accept only at their neutral value (penalties,
logit_bias, echo, suffix, best_of, tools, response_format) are refused otherwise rather than silently ignored.
"""
from __future__ import annotations

import time
import uuid
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.spec_mode import parse_speculation

REQUEST_CONFIG = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False, protected_namespaces=())


class StreamOptions(BaseModel):
    model_config = REQUEST_CONFIG
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    model_config = REQUEST_CONFIG

    model: str | None = None  # None: the served model
    max_tokens: int | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, le=2**31 - 1)  # the engine clamps it to the vocabulary; bounded so it fits a tensor
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    speculation: str | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, ge=0.01, le=100.0)  # vLLM's extension
    logit_bias: dict[str, float] | None = None  # token id (as a string, as OpenAI's API sends it) -> bias

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        """Keys must read as token ids; the values' range is SamplingParams' check (a 400 at the ingress too)."""
        for key in v or {}:
            if not key.isdigit():
                raise ValueError(f"logit_bias keys must be token ids, got {key!r}")
        return v

    def token_logit_bias(self) -> dict[int, float] | None:
        return {int(k): float(b) for k, b in self.logit_bias.items()} if self.logit_bias else None

    @field_validator("speculation")
    @classmethod
    def _speculation(cls, v: str | None) -> str | None:
        if v is not None:
            parse_speculation(v)  # ValueError -> a 400 with the parser's message
        return v

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v < -1:
            raise ValueError("top_k must be -1 (disabled), 0 (disabled) or a positive integer")
        return v

    @model_validator(mode="after")
    def _unsupported(self):
        for name, neutral in self._NEUTRAL.items():
            value = getattr(self, name)
            if value not in neutral:
                raise ValueError(f"{name}={value!r} is not supported by this server")
        return self

    _NEUTRAL: ClassVar[dict] = {}

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    _NEUTRAL: ClassVar[dict] = {**_SamplingRequest._NEUTRAL, "echo": (False,), "suffix": (None, "")}

    @model_validator(mode="after")
    def _best_of(self):
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of is not supported (only best_of == n)")
        return self

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise ValueError("prompt must not be empty")
        if isinstance(p[0], int):
            return [p]
        return list(p)


class TextPart(BaseModel):
    model_config = REQUEST_CONFIG
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = REQUEST_CONFIG
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def as_template_dict(self) -> dict:
        content = self.content
        if isinstance(content, list):
            content = "\n".join(part.text for part in content)
        # The chat templates we serve know system/user/assistant; a developer message is a system message.
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": content or ""}


class ResponseFormat(BaseModel):
    model_config = REQUEST_CONFIG
    type: Literal["text"] = "text"  # json modes are not supported


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    tools: list[Any] | None = None
    tool_choice: Literal["none"] | None = None
    response_format: ResponseFormat | None = None

    _NEUTRAL: ClassVar[dict] = {**_SamplingRequest._NEUTRAL, "tools": (None, [])}

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# ----- responses ------------------------------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens found in the prefix cache


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None


class SpeculativeDecodingMetrics(BaseModel):
    mean_acceptance_length: float = 1.0  # tokens emitted per speculative step (accepted drafts + 1)
    acceptance_rate: float = 0.0  # accepted / verified draft tokens
    num_spec_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @classmethod
    def total(cls, metrics: list[dict]) -> SpeculativeDecodingMetrics:
        """Summed over the choices' engine metrics (RequestOutput.metrics)."""
        steps = sum(m.get("num_spec_steps", 0) for m in metrics)
        drafts = sum(m.get("num_draft_tokens", 0) for m in metrics)
        accepted = sum(m.get("num_accepted_tokens", 0) for m in metrics)
        return cls(mean_acceptance_length=1.0 + accepted / steps if steps else 1.0,
                   acceptance_rate=accepted / drafts if drafts else 0.0,
                   num_spec_steps=steps, num_draft_tokens=drafts, num_accepted_tokens=accepted)


class ResponseMetrics(BaseModel):
    speculative_decoding: SpeculativeDecodingMetrics


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    metrics: ResponseMetrics | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo | None = None
    metrics: ResponseMetrics | None = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None
    metrics: ResponseMetrics | None = None


class CompletionChunk(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    metrics: ResponseMetrics | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "dspark-serve"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo


ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowedError",
               413: "RequestTooLargeError", 429: "RateLimitError", 500: "InternalServerError",
               503: "ServiceUnavailableError"}


class APIError(Exception):
    """An error the client should see as `{"error": {...}}` with this HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers

    def body(self) -> dict:
        return ErrorResponse(error=ErrorInfo(message=self.message, type=ERROR_TYPES.get(self.status, "Error"),
                                             param=self.param, code=self.status)).model_dump()


def validation_message(exc) -> str:
    """A pydantic ValidationError as one line: 'field: problem; field: problem'."""
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err.get("loc", ()) if not _is_union_tag(x))
        msg = err.get("msg", "invalid").removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(dict.fromkeys(parts)) or "invalid request"


def _is_union_tag(x) -> bool:
    # pydantic names union members in locations ('prompt', 'list[int]', 1); clients want 'prompt.1'.
    return isinstance(x, str) and ("[" in x or x in ("str", "int", "float", "bool"))


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"



# ----- OpenAPI -----------------------------------------------------------------------------------------------------

SPECULATION_PATTERN = r"^(off|adaptive|fixed:[0-9]{1,3}|threshold:(0(\.[0-9]{1,6})?|1(\.0{1,6})?))$"
ERROR_STATUSES = (400, 404, 413, 429, 500, 503)


def _non_null(prop: dict) -> list[dict]:
    """The non-null branches of a property schema (pydantic writes `X | None` as anyOf [X, null])."""
    return [b for b in prop.get("anyOf", [prop]) if b.get("type") != "null"]


def _constrain(prop: dict, **constraints) -> None:
    for branch in _non_null(prop):
        branch.update(constraints)


def openapi_schema(model_name: str, limits, max_model_len: int, vocab_size: int | None = None) -> dict:
    """The OpenAPI 3.1 document of the HTTP API, with the real request bodies: the pydantic request models, narrowed
    by this deployment's limits (deployments.config.RequestLimits) and context length, and the error shape of every
    4xx/5xx. The server's own checks stay authoritative (e.g. prompt + max_tokens against the context)."""
    from pydantic.json_schema import models_json_schema

    models = [CompletionRequest, ChatCompletionRequest, CompletionResponse, ChatCompletionResponse, CompletionChunk,
              ChatCompletionChunk, ModelList, ErrorResponse]
    _, top = models_json_schema([(m, "validation" if m.__name__.endswith("Request") else "serialization")
                                 for m in models], ref_template="#/components/schemas/{model}")
    schemas = top["$defs"]
    max_prompt = min(limits.max_prompt_tokens or max_model_len - 1, max_model_len - 1)
    token = {"type": "integer", "minimum": 0}
    if vocab_size:
        token["maximum"] = vocab_size - 1
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        props = schemas[name]["properties"]
        props["model"] = {"anyOf": [{"type": "string", "enum": [model_name]}, {"type": "null"}], "default": None,
                          "description": "the served model (optional)"}
        props["top_k"].update(minimum=-1)
        _constrain(props["max_tokens"], minimum=1, maximum=limits.max_tokens)
        props["n"].update(maximum=limits.max_n)
        stop_string = {"type": "string", "minLength": 1, "maxLength": limits.max_stop_chars}
        props["stop"]["anyOf"] = [stop_string, {"type": "array", "items": stop_string, "maxItems": limits.max_stop},
                                  {"type": "null"}]
        _constrain(props["stop_token_ids"], items=token, maxItems=limits.max_stop_token_ids)
        _constrain(props["speculation"], pattern=SPECULATION_PATTERN)
        _constrain(props["logit_bias"], propertyNames={"pattern": "^[0-9]+$"},
                   description="token id -> bias in [-100, 100]")
    chat = schemas["ChatCompletionRequest"]["properties"]
    _constrain(chat["max_completion_tokens"], minimum=1, maximum=limits.max_tokens)
    _constrain(chat["top_logprobs"], maximum=limits.max_logprobs)
    chat["messages"]["maxItems"] = limits.max_messages
    _constrain(chat["tools"], maxItems=0, description="accepted only empty")
    completion = schemas["CompletionRequest"]["properties"]
    _constrain(completion["logprobs"], maximum=limits.max_logprobs)
    completion["echo"].update(enum=[False])
    _constrain(completion["suffix"], maxLength=0)
    ids = {"type": "array", "items": token, "minItems": 1, "maxItems": max_prompt}
    completion["prompt"]["anyOf"] = [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": limits.max_choices},
        ids,
        {"type": "array", "items": ids, "minItems": 1, "maxItems": limits.max_choices},
    ]

    def ref(name: str) -> dict:
        return {"$ref": f"#/components/schemas/{name}"}

    errors = {str(code): {"description": ERROR_TYPES[code],
                          "content": {"application/json": {"schema": ref("ErrorResponse")}}}
              for code in ERROR_STATUSES}

    def sse(chunk: str) -> dict:
        """One server-sent event (OpenAPI 3.1: the schema of a stream's media type describes each event): a JSON
        chunk, an error object (then the stream ends), or the final [DONE]."""
        data = {"anyOf": [{"type": "string", "const": "[DONE]"},
                          {"type": "string", "contentMediaType": "application/json",
                           "contentSchema": {"anyOf": [ref(chunk), ref("ErrorResponse")]}}]}
        return {"type": "object", "required": ["data"],
                "properties": {"data": data, "event": {"type": "string"}, "id": {"type": "string"}}}

    def generation(request: str, response: str, chunk: str, summary: str) -> dict:
        return {"post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": ref(request)}}},
            "responses": {"200": {"description": "the answer (JSON), or server-sent events with `stream: true`",
                                  "content": {"application/json": {"schema": ref(response)},
                                              "text/event-stream": {"schema": sse(chunk)}}},
                          **errors}}}

    def get(summary: str, content: dict, *codes: int) -> dict:
        return {"get": {"summary": summary, "responses": {
            "200": {"description": "OK", "content": content},
            **{str(c): errors[str(c)] for c in codes}}}}

    json_object = {"application/json": {"schema": {"type": "object"}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "dspark-serve", "version": "1",
                 "description": f"OpenAI-compatible API serving `{model_name}` (context {max_model_len} tokens)"},
        "paths": {
            "/v1/completions": generation("CompletionRequest", "CompletionResponse", "CompletionChunk",
                                          "Text completion"),
            "/v1/chat/completions": generation("ChatCompletionRequest", "ChatCompletionResponse",
                                               "ChatCompletionChunk", "Chat completion"),
            "/v1/models": get("Served models", {"application/json": {"schema": ref("ModelList")}}, 503),
            "/health": get("Health", json_object, 503),
            "/stats": get("One replica's engine statistics", json_object, 500, 503),
            "/metrics": get("Prometheus metrics of every replica", {"text/plain": {"schema": {"type": "string"}}}),
            "/openapi.json": get("This document", json_object, 503),
        },
        "components": {"schemas": schemas},
    }
