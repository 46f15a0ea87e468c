"""Who is calling: the presented API key becomes an ``Identity``.

Keys are stored only as the SHA-256 of the secret (``pharos keys new``); a request's key is
hashed and looked up in a dict a reload swaps whole (``Keyring`` is immutable), so a lookup
never sees half a key set and costs one hash. The lookup compares digests, never the secret,
so its time says nothing of how much of a guess was right; the found entry's digest is
compared again with ``hmac.compare_digest``.

Clients send ``Authorization: Bearer KEY`` (OpenAI's SDKs, ollama's client) or ``x-api-key:
KEY`` (Anthropic's SDKs, Claude Code). With no keys configured every client is ``anonymous``,
an admin, but the routes an admin alone may use then answer loopback clients only
(``pharos.proxy.site.require_loopback``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from twisted.web.iweb import IRequest

from pharos.config import DEFAULT_TENANT, DEFAULT_WEIGHT, Key, Tenant
from pharos.proxy.errors import ApiError

#: The one identity every client is while no keys are configured.
ANONYMOUS = "anonymous"
#: Longer credentials are refused unhashed (a key ``pharos keys new`` makes has 51 chars).
MAX_KEY_CHARS = 512
#: Prefix of the keys ``pharos keys new`` makes, so a leaked one is recognisable in a scan.
KEY_PREFIX = "phk-"


@dataclass(frozen=True, slots=True)
class Identity:
    """A caller: its key's name and limits, and its tenant's. ``models`` ``None`` allows all."""

    name: str
    tenant: str = DEFAULT_TENANT
    weight: int = DEFAULT_WEIGHT
    tenant_weight: int = DEFAULT_WEIGHT
    rpm: int | None = None
    tokens_per_day: int | None = None
    tenant_rpm: int | None = None
    tenant_tokens_per_day: int | None = None
    models: frozenset[str] | None = None
    admin: bool = False

    def may_use(self, model: str) -> bool:
        """Whether the key's allow-list (if any) has ``model``."""
        return self.models is None or model in self.models


#: Who calls while no keys are configured: nothing limited; the admin routes are loopback-only.
OPEN = Identity(ANONYMOUS, admin=True)


def new_key() -> tuple[str, str]:
    """A fresh key and its SHA-256 (hex): 256 bits from the OS's CSPRNG."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, digest(key)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


#: Both schemes a key may come in: Basic makes a browser ask for it (user anything, the key
#: as password) and send it with the page's own requests, the event stream of /live
#: included, which a page's script cannot give an Authorization header.
CHALLENGE = b'Bearer, Basic realm="pharos", charset="UTF-8"'


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, type="invalid_request_error", code="invalid_api_key",
                    headers=((b"www-authenticate", CHALLENGE),))


class Keyring:
    """The configured keys by digest; immutable, so a reload builds a new one and swaps it."""

    def __init__(self, keys: tuple[Key, ...] = (), tenants: tuple[Tenant, ...] = ()) -> None:
        by_tenant = {t.name: t for t in tenants}
        self.open = not keys
        self._by_digest: dict[bytes, tuple[bytes, Identity]] = {}
        for k in keys:
            t = by_tenant.get(k.tenant)
            who = Identity(
                name=k.name, tenant=k.tenant, weight=k.weight,
                tenant_weight=t.weight if t is not None else DEFAULT_WEIGHT,
                rpm=k.rpm, tokens_per_day=k.tokens_per_day,
                tenant_rpm=t.rpm if t is not None else None,
                tenant_tokens_per_day=t.tokens_per_day if t is not None else None,
                models=frozenset(k.models) if k.models else None, admin=k.admin)
            raw = bytes.fromhex(k.sha256)
            self._by_digest[raw] = (raw, who)

    def identify(self, request: IRequest) -> Identity:
        """The caller of ``request``; raises a 401 ``ApiError`` for a missing, malformed or
        unknown key (never saying which of the configured keys came close)."""
        if self.open:
            return OPEN
        presented = presented_key(request)
        if presented is None:
            raise unauthorized("an API key is required: send Authorization: Bearer KEY "
                               "(or x-api-key: KEY)")
        if len(presented) > MAX_KEY_CHARS:
            raise unauthorized("invalid API key")
        found = hashlib.sha256(presented).digest()
        entry = self._by_digest.get(found)
        if entry is None or not hmac.compare_digest(entry[0], found):
            raise unauthorized("invalid API key")
        return entry[1]

    def names(self) -> frozenset[str]:
        return frozenset(who.name for _, who in self._by_digest.values())


def presented_key(request: IRequest) -> bytes | None:
    """The key a request presents: ``Authorization: Bearer KEY`` (or ``Basic`` with the key
    as password, as a browser sends it), else ``x-api-key``; surrounding whitespace is the
    header's. A malformed Authorization is a 401 naming the form expected."""
    auth = request.getHeader(b"authorization")
    if auth is not None:
        parts = auth.strip().split(None, 1)
        scheme = parts[0].lower() if parts else b""
        if len(parts) != 2 or scheme not in (b"bearer", b"basic") or not parts[1].strip() or (
                len(parts[1].split()) != 1):
            raise unauthorized("malformed Authorization header: expected Bearer KEY")
        if scheme == b"basic":
            try:
                user, _, password = base64.b64decode(parts[1].strip(), validate=True
                                                     ).partition(b":")
            except (ValueError, binascii.Error):
                raise unauthorized("malformed Authorization header: Basic needs "
                                   "base64 of user:KEY") from None
            return password or user
        return parts[1].strip()
    key = request.getHeader(b"x-api-key")
    if key is not None:
        key = key.strip()
        if not key or len(key.split()) != 1:
            raise unauthorized("malformed x-api-key header")
        return key
    return None
