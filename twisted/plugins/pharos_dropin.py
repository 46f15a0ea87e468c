"""twistd plugin: ``twistd pharos``. Imports nothing else, so discovery never installs a reactor."""

from twisted.application.service import ServiceMaker

pharos = ServiceMaker("Pharos", "pharos.tap", "LLM inference router", "pharos")
