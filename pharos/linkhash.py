"""The common links of a chat's prefix chain, compiled by mypyc (``pharos.compiled``).

Most messages are a dict of a known role and a string content and nothing else; their links
are SHA-256 of the previous digest and the message's length-prefixed fields
(``pharos.prefix``'s module docstring has the layout). Interpreted, the Python around the
hashing is a large share of a chain's time; compiled, most of it goes.
``pharos.prefix._chat_chain`` calls this for each run of common messages and hashes any other
message itself; this source, its compiled form and the general path give the same digests
(the tests compare them).
"""

from __future__ import annotations

import hashlib
from typing import Final

#: Bytes of each field's length prefix (``pharos.prefix._LEN``).
LEN: Final = 8
#: The role field of each known role, length-prefixed (``pharos.prefix._ROLE_FIELDS``).
ROLE_FIELDS: Final[dict[str, bytes]] = {
    r: len(r).to_bytes(LEN, "big") + r.encode() for r in
    ("system", "user", "assistant", "tool", "developer", "function", "")}
#: The field of no extra fields (``pharos.prefix._NO_EXTRA``).
NO_EXTRA: Final = bytes(LEN)


def common_links(prev: bytes, messages: list[object], start: int, total: int,
                 keys: list[int], ends: list[int]) -> tuple[int, bytes, int]:
    """Hash ``messages`` from ``start`` while each is a common message, appending each link's
    key and prompt end to ``keys`` and ``ends``. Returns the index of the first message it
    did not hash, the last digest and the running total of prompt bytes."""
    sha256 = hashlib.sha256
    i = start
    count = len(messages)
    while i < count:
        message = messages[i]
        if type(message) is not dict or len(message) != 2:
            break
        role = message.get("role")
        content = message.get("content")
        if type(role) is not str or type(content) is not str:
            break
        role_field = ROLE_FIELDS.get(role)
        if role_field is None:
            break
        text = content.encode("utf-8", "surrogatepass")
        n = len(text)
        h = sha256(prev + role_field + (n + 1).to_bytes(LEN, "big") + b"s")
        h.update(text)
        h.update(NO_EXTRA)
        prev = h.digest()
        total += n
        keys.append(int.from_bytes(prev[:8], "big"))
        ends.append(total)
        i += 1
    return i, prev, total
