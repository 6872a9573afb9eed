"""API errors and their two wire shapes: OpenAI `{"error": {...}}` and Anthropic
`{"type": "error", "error": {...}}`. The protocol is chosen from the request path."""
from __future__ import annotations

from fastapi.responses import JSONResponse

# status -> (openai type, anthropic type)
_TYPES = {
    400: ("invalid_request_error", "invalid_request_error"),
    401: ("authentication_error", "authentication_error"),
    403: ("permission_error", "permission_error"),
    404: ("not_found_error", "not_found_error"),
    405: ("invalid_request_error", "invalid_request_error"),
    413: ("invalid_request_error", "request_too_large"),
    415: ("invalid_request_error", "invalid_request_error"),
    429: ("rate_limit_error", "rate_limit_error"),
    500: ("server_error", "api_error"),
    503: ("server_error", "overloaded_error"),
}


class APIError(Exception):
    status = 400

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None,
                 param: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.message = message
        self.status = status or self.status
        self.code = code
        self.param = param
        self.retry_after = retry_after


class BadRequest(APIError):
    status = 400


class ContextOverflow(APIError):
    """The prompt does not fit the context window, in each protocol's own words: agents
    match these texts (and OpenAI's code) to decide to compact instead of retrying."""
    status = 400

    def __init__(self, n_prompt: int, window: int):
        # the window must hold the prompt plus at least one output token
        super().__init__(
            f"This model's maximum context length is {window} tokens. However, you requested "
            f"{n_prompt + 1} tokens ({n_prompt} in the messages, 1 in the completion). Please "
            f"reduce the length of the messages or completion.",
            code="context_length_exceeded", param="messages")
        self.n_prompt, self.window = n_prompt, window
        self.anthropic_message = f"prompt is too long: {n_prompt} tokens > {window - 1} maximum"


class Unauthorized(APIError):
    status = 401


class NotFound(APIError):
    status = 404


class Overloaded(APIError):
    """The waiting queue is full (429) or the server cannot take work (503)."""

    def __init__(self, message: str, status: int = 429, retry_after: int = 1):
        super().__init__(message, status=status, retry_after=retry_after)


def is_anthropic_path(path: str) -> bool:
    return path.startswith("/v1/messages") or path.startswith("/anthropic/")


def error_body(err: APIError, anthropic: bool) -> dict:
    oa_type, an_type = _TYPES.get(err.status, ("server_error", "api_error"))
    if anthropic:
        message = getattr(err, "anthropic_message", None) or err.message
        return {"type": "error", "error": {"type": an_type, "message": message}}
    return {"error": {"message": err.message, "type": oa_type, "param": err.param,
                      "code": err.code}}


def error_response(err: APIError, path: str) -> JSONResponse:
    headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else None
    return JSONResponse(error_body(err, is_anthropic_path(path)), status_code=err.status,
                        headers=headers)
