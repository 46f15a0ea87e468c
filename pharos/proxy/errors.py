"""Errors shaped for the client that sent the request: OpenAI routes get ``{"error":
{"message", "type", "code"}}``, Ollama routes ``{"error": "..."}``."""

from __future__ import annotations

import json


class ApiError(Exception):
    """A request Pharos answers itself, with this status and an error body in the client's
    API shape. ``type`` and ``code`` follow OpenAI's where one fits, since SDKs read them."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 code: str | None = None,
                 headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.headers = headers  # sent with the error (Retry-After, WWW-Authenticate)

    def body(self, ollama: bool, anthropic: bool = False) -> bytes:
        """The error body in the API shape of the route (Anthropic's for ``/v1/messages``,
        which Claude Code reads: ``{"type": "error", "error": {"type", "message"}}``)."""
        if ollama:
            return json.dumps({"error": self.message}).encode()
        if anthropic:
            kind = ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500
                                       else "invalid_request_error")
            return json.dumps({"type": "error",
                               "error": {"type": kind, "message": self.message}}).encode()
        return json.dumps({"error": {"message": self.message, "type": self.type,
                                     "param": None, "code": self.code}}).encode()


#: Anthropic's error types by status (its API reference, "Errors").
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                   403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                   429: "rate_limit_error", 500: "api_error", 503: "overloaded_error",
                   529: "overloaded_error"}


def is_anthropic_path(path: bytes) -> bool:
    """Anthropic's Messages route answers in Anthropic's error shape."""
    return path.split(b"?", 1)[0] == b"/v1/messages"


def is_ollama_path(path: bytes) -> bool:
    """Ollama's native routes (and the root banner) answer in Ollama's error shape."""
    return path.startswith(b"/api/") or path == b"/api"


def bad_json(why: str) -> ApiError:
    return ApiError(400, f"request body is not valid JSON: {why}", code="invalid_json")


#: The most of a client's string an error message repeats.
ECHO_CHARS = 200


def echo(text: str) -> str:
    """A client's string as an error may repeat it: at most ``ECHO_CHARS`` characters."""
    return text if len(text) <= ECHO_CHARS else text[:ECHO_CHARS] + f"... ({len(text)} chars)"


def too_deep(limit: int) -> ApiError:
    return ApiError(400, f"request body nests JSON deeper than {limit} levels",
                    code="invalid_json")


def wrong_type(field: str, expected: str, got: object) -> ApiError:
    return ApiError(400, f"{field} must be {expected}, not {type(got).__name__}",
                    code="invalid_type")


def missing_model() -> ApiError:
    return ApiError(400, "model is required", code="missing_required_parameter")


def unknown_model(model: str) -> ApiError:
    return ApiError(404, f"The model `{echo(model)}` does not exist or no backend lists it",
                    code="model_not_found")


def unavailable(model: str) -> ApiError:
    return ApiError(503, f"no backend serving `{echo(model)}` is up", type="server_error",
                    code="model_unavailable")


def queue_full() -> ApiError:
    return ApiError(429, "too many requests are waiting; retry later",
                    type="rate_limit_error", code="queue_full")


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body is larger than {limit} bytes",
                    code="request_too_large")


def model_not_allowed(key: str, model: str) -> ApiError:
    return ApiError(403, f"key {echo(key)!r} may not use model `{echo(model)}`",
                    type="permission_error", code="model_not_allowed")


def admin_only() -> ApiError:
    return ApiError(403, "this route needs an admin key", type="permission_error",
                    code="admin_required")


def loopback_only() -> ApiError:
    return ApiError(403, "no keys are configured: this route answers loopback clients only; "
                         "configure keys (docs: Security)", type="permission_error",
                    code="loopback_only")


def upstream(message: str, status: int = 502) -> ApiError:
    return ApiError(status, message, type="server_error", code="upstream_error")
