"""The OpenAI API as this server speaks it: request bodies in, ``SamplingParams`` out, and the
JSON shapes of responses, stream chunks and errors.

Requests are pydantic models (types and finite numbers are checked by pydantic, ranges by
``SamplingParams``, context length here), so every bad field comes back as a 400 that names
the field and the limit. Responses are plain dicts in OpenAI's shape: ``choices``, ``usage``,
``finish_reason`` and, for streams, one ``chunk`` object per server-sent event. Parameters
vLLM adds to the OpenAI API (``top_k``, ``min_tokens``, ``ignore_eos``, ``stop_token_ids``,
...) are accepted too; the ``openai`` client sends them through ``extra_body``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from minivllm.engine.input_processor import InputProcessor
from minivllm.engine.input_processor import check_prompt_length as engine_prompt_length_rule
from minivllm.outputs import CompletionOutput, RequestOutput
from minivllm.sampling_params import SamplingParams, is_valid_unicode, short_repr

MAX_N = 128  # OpenAI's limit on choices per request
MAX_PROMPTS = 2048  # OpenAI's limit on prompts in one completions request
MAX_LOGPROBS = 20  # OpenAI's limit on top_logprobs



class InvalidRequestError(ValueError):
    """A request the server refuses with 400; ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def error_body(message: str, type_: str, param: str | None = None, code: int | str | None = None) -> dict:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# --- requests -------------------------------------------------------------------------------
class _Body(BaseModel):
    # Unknown fields are ignored (new OpenAI fields must not break old servers); NaN and
    # infinity are refused (Python's json module accepts them).
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class StreamOptions(_Body):
    include_usage: bool = False


class _SamplingFields(_Body):
    model: str | None = None
    n: StrictInt = 1
    temperature: float = 1.0
    top_p: float = 1.0
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # OpenAI parameters the engine does not implement: refused unless left at their default
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    # vLLM's extensions
    top_k: StrictInt = 0
    min_tokens: StrictInt = 0
    ignore_eos: bool = False
    stop_token_ids: list[StrictInt] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    priority: StrictInt = 0
    # vLLM's: requests with different salts never share prefix-cache blocks (see docs/serving.md)
    cache_salt: str | None = None

    def requested_max_tokens(self) -> int | None:
        raise NotImplementedError

    def num_logprobs(self) -> int | None:
        raise NotImplementedError


class CompletionRequest(_SamplingFields):
    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]]
    max_tokens: StrictInt | None = 16
    logprobs: StrictInt | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: StrictInt | None = None
    prompt_logprobs: StrictInt | None = None

    def prompts(self) -> list[str | list[int]]:
        """A completions request may carry one prompt or a batch: always a list here."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        if not p:
            raise InvalidRequestError("prompt is empty: give a string, token ids, or a list of them", "prompt")
        return list(p)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def num_logprobs(self) -> int | None:
        return self.logprobs


class TextPart(_Body):
    type: str
    text: str | None = None


class ChatMessage(_Body):
    role: str
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise InvalidRequestError(
                    f"content part type {part.type!r} is not supported (only 'text')", "messages"
                )
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = None  # deprecated by OpenAI in favour of max_completion_tokens
    max_completion_tokens: StrictInt | None = None
    logprobs: bool = False
    top_logprobs: StrictInt | None = None
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None
    add_generation_prompt: bool = True  # vLLM's extension

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def num_logprobs(self) -> int | None:
        if not self.logprobs:
            if self.top_logprobs:
                raise InvalidRequestError("top_logprobs requires logprobs=true", "top_logprobs")
            return None
        return self.top_logprobs or 0


# --- parsing a body, and what is checked before any tokenizing ---------------------------------
def parse_body(raw: bytes, model: type[_SamplingFields], max_model_len: int) -> _SamplingFields:
    """JSON bytes -> a validated request. The number of messages or prompts is checked on the
    parsed JSON before pydantic builds an object for each of them."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as error:  # JSONDecodeError, bad UTF-8, deep nesting
        raise InvalidRequestError(f"malformed JSON body: {short_repr(str(error), 120)}") from None
    if isinstance(data, dict):
        _check_counts(data, max_model_len)
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise InvalidRequestError(*validation_message(error.errors())) from None


def _check_counts(data: dict, max_model_len: int) -> None:
    messages, prompt = data.get("messages"), data.get("prompt")
    if isinstance(messages, list) and len(messages) > max_model_len:
        raise InvalidRequestError(
            f"a conversation may have at most {max_model_len} messages (every message takes at least one "
            f"of the model's {max_model_len} context tokens), got {len(messages)}", "messages",
        )
    if not isinstance(prompt, list) or not prompt:
        return
    if isinstance(prompt[0], int):
        check_prompt_length(len(prompt), max_model_len, "prompt")
        return
    if len(prompt) > MAX_PROMPTS:
        raise InvalidRequestError(f"a request may carry at most {MAX_PROMPTS} prompts, got {len(prompt)}", "prompt")
    for ids in prompt:
        if isinstance(ids, list):
            check_prompt_length(len(ids), max_model_len, "prompt")


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """Pydantic's errors -> one sentence naming each field (quoting a short piece of the input)."""
    parts, param = [], None
    for err in errors[:5]:
        loc = [str(x) for x in err.get("loc", ())]
        field = ".".join(loc)
        param = param or (loc[0] if loc else None)
        got = f" (got {short_repr(err.get('input'))})" if loc else ""
        parts.append(f"{field}: {err.get('msg')}{got}" if loc else str(err.get("msg")))
    more = f"; and {len(errors) - 5} more errors" if len(errors) > 5 else ""
    return "invalid request: " + "; ".join(parts) + more, param


def max_prompt_chars(tokenizer, max_model_len: int) -> int:
    """The most characters a prompt that fits the context can have: every token covers at most
    as many characters as its longest vocabulary entry (a byte-level token string spells one
    character per byte; SentencePiece spells the text itself), so a longer text cannot fit in
    ``max_model_len - 1`` tokens, and is refused before it is tokenized."""
    longest = max((len(token) for token in tokenizer.get_vocab()), default=1)
    return (max_model_len - 1) * max(longest, 1)


def check_text(text: str, param: str, what: str, char_limit: int) -> None:
    """A prompt's text, before tokenizing: valid Unicode, and short enough that it could fit."""
    if not is_valid_unicode(text):
        raise InvalidRequestError(f"{what} is not valid Unicode (it has a lone surrogate)", param)
    if len(text) > char_limit:
        raise InvalidRequestError(
            f"{what} has {len(text)} characters, more than can fit in this model's context (at most "
            f"{char_limit} characters: no token of its tokenizer covers more than {char_limit} / "
            f"(max_model_len - 1) of them)", param,
        )


def check_cache_salt(req: _SamplingFields) -> None:
    with refused_as("cache_salt"):
        InputProcessor.check_cache_salt(req.cache_salt)


# --- checks and the mapping to SamplingParams ---------------------------------------------------
def _refuse_unsupported(req: _SamplingFields) -> None:
    if req.presence_penalty or req.frequency_penalty:
        name = "presence_penalty" if req.presence_penalty else "frequency_penalty"
        raise InvalidRequestError(f"{name} is not supported by this engine (only 0)", name)
    if req.logit_bias:
        raise InvalidRequestError("logit_bias is not supported by this engine", "logit_bias")
    if isinstance(req, CompletionRequest):
        if req.suffix:
            raise InvalidRequestError("suffix is not supported by this engine", "suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise InvalidRequestError(
                f"best_of={req.best_of} is not supported (it must equal n={req.n})", "best_of"
            )
        if req.prompt_logprobs is not None:
            raise InvalidRequestError("prompt_logprobs is not supported by this engine yet", "prompt_logprobs")
    if isinstance(req, ChatCompletionRequest):
        if req.tools:
            raise InvalidRequestError("tools are not supported by this engine", "tools")
        if req.response_format and req.response_format.get("type", "text") != "text":
            raise InvalidRequestError("only response_format type 'text' is supported", "response_format")
    num = req.num_logprobs()
    if num is not None:
        if not 0 <= num <= MAX_LOGPROBS:
            raise InvalidRequestError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {num}", "logprobs")


def param_named_in(message: str, body: type[_SamplingFields]) -> str | None:
    """``SamplingParams`` and engine errors start with the field's name ("top_p must be in
    (0, 1]...", "stop string 1 is not valid Unicode")."""
    first = re.match(r"[a-z_]+", message)
    return first.group() if first and first.group() in body.model_fields else None


def to_sampling_params(req: _SamplingFields, prompt_len: int, max_model_len: int) -> SamplingParams:
    """Check what the engine cannot serve and build its ``SamplingParams``. ``prompt_len``
    is in tokens; prompt + completion must fit in ``max_model_len``."""
    _refuse_unsupported(req)
    if not 1 <= req.n <= MAX_N:
        raise InvalidRequestError(f"n must be in [1, {MAX_N}], got n={req.n}", "n")
    max_tokens = req.requested_max_tokens()
    room = max_model_len - prompt_len
    if max_tokens is None:
        max_tokens = room  # chat default: as much as the context allows
    elif max_tokens >= 1 and max_tokens > room:
        name = "max_completion_tokens" if getattr(req, "max_completion_tokens", None) else "max_tokens"
        raise InvalidRequestError(
            f"this model's maximum context length is {max_model_len} tokens; the prompt has "
            f"{prompt_len} tokens, so {name} may be at most {room}, got {max_tokens}",
            name,
        )
    try:
        return SamplingParams(
            n=req.n,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            stop=req.stop,
            stop_token_ids=req.stop_token_ids,
            ignore_eos=req.ignore_eos,
            seed=req.seed,
            skip_special_tokens=req.skip_special_tokens,
            include_stop_str_in_output=req.include_stop_str_in_output,
            logprobs=req.num_logprobs(),
        )
    except (ValueError, TypeError) as error:
        raise InvalidRequestError(str(error), param_named_in(str(error), type(req))) from error


def check_prompt_length(prompt_len: int, max_model_len: int, param: str) -> None:
    """The engine's length rule (:func:`minivllm.engine.input_processor.check_prompt_length`),
    applied to a list of ids before anything is built for it, as a 400 naming ``param``."""
    with refused_as(param):
        engine_prompt_length_rule(prompt_len, max_model_len)


@contextmanager
def refused_as(param: str | None) -> Iterator[None]:
    """The engine's own refusal of an input (``ValueError`` / ``TypeError`` from
    :class:`~minivllm.engine.input_processor.InputProcessor`, the owner of every request rule)
    as a 400 that names ``param``."""
    try:
        yield
    except InvalidRequestError:
        raise
    except (ValueError, TypeError) as error:
        raise InvalidRequestError(str(error), param) from None


def render_chat(tokenizer, req: ChatCompletionRequest, char_limit: int | None = None) -> list[int]:
    """The tokenizer's chat template -> prompt token ids. The template writes any BOS itself,
    so the text is tokenized without adding special tokens again. Messages whose content alone
    has more than ``char_limit`` characters are refused before the template runs."""
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidRequestError(
            "this model's tokenizer has no chat template; use /v1/completions", "messages"
        )
    messages = [{"role": m.role, "content": m.text()} for m in req.messages]
    for i, m in enumerate(messages):
        if not is_valid_unicode(m["content"]) or not is_valid_unicode(m["role"]):
            raise InvalidRequestError(f"messages[{i}] is not valid Unicode (it has a lone surrogate)", "messages")
    if char_limit is not None:
        check_text("".join(m["content"] for m in messages), "messages", "the messages' content", char_limit)
    try:
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=req.add_generation_prompt
        )
    except Exception as error:  # jinja's raise_exception and template errors: the caller's input
        message = short_repr(str(error), 200)
        raise InvalidRequestError(f"the chat template rejected the messages: {message}", "messages") from error
    return list(tokenizer(text, add_special_tokens=False).input_ids)


# --- responses ------------------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def usage_of(outputs: Sequence[RequestOutput]) -> dict:
    """Usage of a whole request (several prompts, n choices each): every prompt counts once."""
    return usage(
        sum(len(o.prompt_token_ids) for o in outputs),
        sum(len(c.token_ids) for o in outputs for c in o.outputs),
        sum(o.num_cached_tokens for o in outputs),
    )


@dataclasses.dataclass(frozen=True)
class ResponseHeader:
    """What every response and chunk of one request repeats."""

    id: str
    model: str
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))


def completion_choice(index: int, text: str, out: CompletionOutput, logprobs: dict | None) -> dict:
    return {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": out.finish_reason,
        "stop_reason": out.stop_reason,
    }


def chat_choice(index: int, out: CompletionOutput, logprobs: dict | None) -> dict:
    return {
        "index": index,
        "message": {"role": "assistant", "content": out.text},
        "logprobs": logprobs,
        "finish_reason": out.finish_reason,
        "stop_reason": out.stop_reason,
    }


def completion_response(head: ResponseHeader, choices: list[dict], usage_: dict) -> dict:
    return {"id": head.id, "object": "text_completion", "created": head.created, "model": head.model,
            "choices": choices, "usage": usage_}


def chat_response(head: ResponseHeader, choices: list[dict], usage_: dict) -> dict:
    return {"id": head.id, "object": "chat.completion", "created": head.created, "model": head.model,
            "choices": choices, "usage": usage_}


def chunk(head: ResponseHeader, kind: Literal["completion", "chat"], choices: list[dict],
          usage_: dict | None = None) -> dict:
    """One server-sent event's payload. ``usage`` is null except in the final usage chunk."""
    obj = "text_completion" if kind == "completion" else "chat.completion.chunk"
    return {"id": head.id, "object": obj, "created": head.created, "model": head.model,
            "choices": choices, "usage": usage_}


# --- log-probabilities: the engine's per-token {token_id: Logprob} in OpenAI's shapes ------------
def _token_text(tokenizer, token_id: int, logprob: Any) -> str:
    text = getattr(logprob, "decoded_token", None)
    return text if text is not None else tokenizer.decode([token_id])


def completion_logprobs(tokenizer, token_ids: Sequence[int], logprobs: Sequence[dict],
                        num_top: int, text_offset: int = 0) -> dict:
    """vLLM's per-token ``{token_id: Logprob}`` dicts -> the completions API's columns:
    ``tokens``, ``token_logprobs``, ``top_logprobs`` (the ``num_top`` best, as text -> logprob)
    and ``text_offset`` (where each token starts in the returned text)."""
    tokens, token_lps, tops, offsets = [], [], [], []
    for token_id, candidates in zip(token_ids, logprobs, strict=True):
        text = _token_text(tokenizer, token_id, candidates[token_id])
        tokens.append(text)
        token_lps.append(candidates[token_id].logprob)
        best = sorted(candidates.items(), key=lambda kv: kv[1].logprob, reverse=True)[:num_top]
        tops.append({_token_text(tokenizer, t, lp): lp.logprob for t, lp in best} if num_top else None)
        offsets.append(text_offset)
        text_offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(tokenizer, token_ids: Sequence[int], logprobs: Sequence[dict], num_top: int) -> dict:
    """The same information in the chat API's shape: ``{"content": [{token, logprob, bytes,
    top_logprobs: [{token, logprob, bytes}]}]}`` (``bytes``: the token's UTF-8 bytes)."""
    content = []
    for token_id, candidates in zip(token_ids, logprobs, strict=True):
        text = _token_text(tokenizer, token_id, candidates[token_id])
        best = sorted(candidates.items(), key=lambda kv: kv[1].logprob, reverse=True)[:num_top]
        top = []
        for t, lp in best:
            t_text = _token_text(tokenizer, t, lp)
            top.append({"token": t_text, "logprob": lp.logprob, "bytes": list(t_text.encode())})
        content.append({"token": text, "logprob": candidates[token_id].logprob,
                        "bytes": list(text.encode()), "top_logprobs": top})
    return {"content": content}
