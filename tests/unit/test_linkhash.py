"""``pharos.linkhash`` (the common links of a chat's chain, compiled by mypyc where ``make
install`` built it) gives the chain ``pharos.prefix``'s general path gives, link for link, for
any mix of common and other messages; its compiled form and its source agree."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pharos.prefix
from pharos import compiled, linkhash
from pharos.prefix import Chain, chain
from tests.support.policy import reference

SOURCE = Path(compiled.__file__).with_name("linkhash.py")
ARTIFACT = Path(compiled.artifact(str(SOURCE)))


REF = reference(SOURCE)


class Text(str):
    """A str subclass: the general path's, not the common one's."""


ROLES = st.sampled_from(["system", "user", "assistant", "tool", "", "critic"])
TEXT = st.text(max_size=40)
MESSAGE = st.one_of(
    st.builds(lambda r, c: {"role": r, "content": c}, ROLES, TEXT),  # common (unless "critic")
    st.builds(lambda r, c: {"role": r, "content": c, "name": "n"}, ROLES, TEXT),
    st.builds(lambda r, c: {"role": r, "content": [{"type": "text", "text": c}]}, ROLES, TEXT),
    st.builds(lambda r, c: {"role": r, "content": Text(c)}, ROLES, TEXT),
    st.builds(lambda c: {"content": c, "name": "x"}, TEXT),
    st.builds(lambda r: {"role": r, "content": None}, ROLES),
    TEXT,
)


def _no_links(prev: bytes, messages: list[object], start: int, total: int, keys: list[int],
              ends: list[int]) -> tuple[int, bytes, int]:
    return start, prev, total


def general(model: str, messages: list[object]) -> Chain:
    """The chain with every message hashed by ``pharos.prefix``'s own loop."""
    original = pharos.prefix.common_links
    pharos.prefix.common_links = _no_links
    try:
        return chain(model, messages, None, None)
    finally:
        pharos.prefix.common_links = original


@settings(max_examples=300, deadline=None)
@given(st.lists(MESSAGE, max_size=12))
def test_the_common_loop_gives_the_general_paths_chain(messages: list[object]) -> None:
    """Runs of common messages hashed by ``linkhash`` and the others by ``prefix`` give the
    same keys and ends as ``prefix`` hashing every message."""
    assert chain("m", messages, None, None) == general("m", messages)


@settings(max_examples=200, deadline=None)
@given(st.lists(MESSAGE, max_size=12), st.integers(0, 3))
def test_the_compiled_loop_and_its_source_agree(messages: list[object], start: int) -> None:
    """The module in use (compiled where built) and its source interpreted stop at the same
    message with the same digest, total, keys and ends."""
    got: tuple[list[int], list[int]] = ([], [])
    want: tuple[list[int], list[int]] = ([], [])
    a = linkhash.common_links(b"\x01" * 32, messages, start, 5, *got)
    b = REF.common_links(b"\x01" * 32, messages, start, 5, *want)
    assert a == b and got == want


def test_a_common_message_is_hashed_by_the_loop() -> None:
    """The loop takes a dict of a known role and a str content and stops at anything else
    (an extra field, an unknown role, a str subclass, a list content)."""
    common = {"role": "user", "content": "hi"}
    for other in ({"role": "user", "content": "hi", "name": "n"},
                  {"role": "critic", "content": "hi"}, {"role": "user", "content": Text("hi")},
                  {"role": "user", "content": [{"type": "text", "text": "hi"}]}, "hi"):
        keys: list[int] = []
        stop, _, total = linkhash.common_links(b"", [common, common, other, common], 0, 0,
                                               keys, [])
        assert (stop, total, len(keys)) == (2, 4, 2), other


def test_a_built_file_is_used() -> None:
    """Where ``make install`` built it, ``pharos.linkhash`` is the compiled module (a refused
    build would leave the comparison above between two interpreted copies), unless
    PHAROS_COMPILED=0."""
    if not ARTIFACT.exists():
        pytest.skip("not built here (make install builds it)")
    status = compiled.status.get("pharos.linkhash")
    assert status == "compiled" or status == f"interpreted ({compiled.ENV}=0)", status
    if status == "compiled":
        assert Path(linkhash.__file__) == ARTIFACT
