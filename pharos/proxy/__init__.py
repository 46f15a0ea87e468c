"""The public HTTP side of Pharos: Klein routes, request parsing, forwarding."""
