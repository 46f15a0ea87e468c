"""Layer 1: keys (issue 11 item 1): a presented key becomes its identity by the SHA-256 of the
secret; missing, malformed and unknown keys are 401s; no keys configured means open."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from twisted.web.test.requesthelper import DummyRequest

from pharos.config import Key, Tenant, parse_config
from pharos.proxy.auth import ANONYMOUS, Keyring, digest, new_key
from pharos.proxy.errors import ApiError

ALICE, BOB = "phk-alice-secret", "phk-bob-secret"
RING = Keyring(
    (Key(name="alice", sha256=digest(ALICE), rpm=60, tokens_per_day=1000, weight=2,
         models=("m1",), tenant="ml"),
     Key(name="bob", sha256=digest(BOB), admin=True)),
    (Tenant(name="ml", weight=3, tokens_per_day=5000),))


def request(**headers: str) -> Any:
    """A request presenting ``headers`` (underscores for dashes)."""
    r = DummyRequest([b""])
    for name, value in headers.items():
        r.requestHeaders.setRawHeaders(name.replace("_", "-").encode(),
                                       [value.encode("latin-1")])
    return r


def refused(r: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        RING.identify(r)
    assert info.value.status == 401 and info.value.code == "invalid_api_key"
    assert dict(info.value.headers)[b"www-authenticate"].startswith(b"Bearer, Basic")
    return info.value


def test_no_keys_is_open() -> None:
    """Without keys every request is the anonymous admin, whatever it presents."""
    ring = Keyring()
    for r in (request(), request(authorization="Bearer nonsense"), request(x_api_key="x")):
        who = ring.identify(r)
        assert who.name == ANONYMOUS and who.admin and who.may_use("anything")


def test_bearer_and_x_api_key_find_the_key_and_its_tenant() -> None:
    """Authorization: Bearer and x-api-key both identify; the identity carries the key's and
    its tenant's limits and weights, and its model list."""
    for r in (request(authorization=f"Bearer {ALICE}"), request(x_api_key=ALICE),
              request(authorization=f"  bearer   {ALICE}  ")):
        who = RING.identify(r)
        assert (who.name, who.tenant, who.weight, who.tenant_weight) == ("alice", "ml", 2, 3)
        assert (who.rpm, who.tokens_per_day, who.tenant_tokens_per_day) == (60, 1000, 5000)
        assert who.may_use("m1") and not who.may_use("m2") and not who.admin
    bob = RING.identify(request(authorization=f"Bearer {BOB}"))
    assert bob.admin and bob.may_use("m2") and bob.tenant == "default"


def test_basic_auth_carries_the_key_as_the_password() -> None:
    """A browser answering the Basic challenge sends user:KEY; the key identifies, whatever
    the user name (or the user name when the password is empty); a wrong one is a 401."""
    import base64

    def basic(text: str) -> Any:
        return request(authorization="Basic " + base64.b64encode(text.encode()).decode())

    assert RING.identify(basic(f"admin:{BOB}")).name == "bob"
    assert RING.identify(basic(f"{ALICE}:")).name == "alice"
    assert refused(basic("admin:phk-nope")).message == "invalid API key"


def test_missing_malformed_and_unknown_keys_are_401() -> None:
    """No key, another scheme, a Bearer without a key or with spaces inside, an unknown or
    wrongly-cased key, and a 10,000-character key are all refused, saying what was wrong."""
    assert "required" in refused(request()).message
    for bad in ("Basic not*base64", "Digest abc", "Bearer", "Bearer ", f"Bearer {ALICE} extra",
                ALICE):
        assert "malformed" in refused(request(authorization=bad)).message
    assert "malformed" in refused(request(x_api_key="a b")).message
    for unknown in ("phk-nobody", ALICE.upper(), ALICE + "x", "k" * 10_000):
        assert refused(request(authorization=f"Bearer {unknown}")).message == "invalid API key"


def test_non_ascii_keys_are_just_unknown() -> None:
    """Header bytes that are not ASCII hash like any other guess: a 401, not a 500."""
    r: Any = DummyRequest([b""])
    r.requestHeaders.setRawHeaders(b"authorization", [b"Bearer \xff\xfe\x00key"])
    refused(r)


def test_new_keys_are_distinct_and_hash_to_their_digest() -> None:
    """Each new key is unique, 256 bits from the OS, and its digest is its SHA-256."""
    keys = {new_key() for _ in range(100)}
    assert len(keys) == 100
    for key, sha in keys:
        assert key.startswith("phk-") and len(key) >= 40 and sha == digest(key)


def test_keys_new_prints_the_key_once_and_an_entry_the_config_accepts(tmp_path: Path) -> None:
    """``pharos keys new --name NAME`` prints the key, then a YAML entry whose SHA-256 is the
    key's; a config with that entry parses and the key identifies as NAME."""
    exe = Path(sys.executable).parent / "pharos"
    r = subprocess.run([str(exe), "keys", "new", "--name", "carol", "--tenant", "ml",
                        "--admin"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    key, entry = r.stdout.split("\n", 1)
    assert r.stdout.count(key) == 1
    doc = {"tenants": [{"name": "ml"}], "keys": yaml.safe_load(entry)}
    cfg = parse_config(yaml.safe_dump(doc))
    who = Keyring(cfg.keys, cfg.tenants).identify(request(authorization=f"Bearer {key}"))
    assert (who.name, who.tenant, who.admin) == ("carol", "ml", True)
    bad = subprocess.run([str(exe), "keys", "new", "--name", " "], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "--name" in bad.stderr


def test_a_key_naming_an_unknown_tenant_is_a_config_error() -> None:
    """keys[].tenant must name a tenant in tenants: (or be the default)."""
    from pharos.config import ConfigError

    text = f"keys: [{{name: a, sha256: {digest(ALICE)}, tenant: nope}}]\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert "keys[0].tenant: no tenant named 'nope' in tenants" in info.value.errors
