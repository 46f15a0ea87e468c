"""Callgrind helper: parse one body (``marked`` or ``plain``) N times (run under
``valgrind --tool=callgrind`` at two N and subtract: instructions per parse)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_parse_cc import body

from pharos.proxy.parse import parse

raw = body(sys.argv[1] == "marked")
for _ in range(int(sys.argv[2])):
    parse(raw, "/v1/messages")
