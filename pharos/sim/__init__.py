"""Simulation: in-process engine doubles.

- ``pharos.sim.double``: ``EngineDouble``, ``start_double``: an Ollama, llama.cpp or vLLM
  look-alike on a loopback port, with test controls.
- ``pharos.sim.model``: ``EngineModel`` (the behaviour interface) and its ``Knobs`` (prefill,
  decode, load, host memory, context and cache, output cap, keep-alive).
- ``pharos.sim.slots``: ``SlotModel``, llama.cpp's and Ollama's behaviour: slots caching on
  their own, one batch step at a time, models loaded and unloaded against host memory.
- ``pharos.sim.batch``: ``BatchModel``, vLLM's behaviour: V1 scheduler steps (token budget,
  chunked prefill, preemption) over a ref-counted KV ``BlockPool`` with prefix caching.
- ``pharos.sim.wire``: reply templates and serializers shared by the engines' wire formats in
  ``pharos.sim.ollama``, ``pharos.sim.llamacpp`` and ``pharos.sim.vllm``.
- ``pharos.sim.prompt``: prompt text, size and prefix blocks of a client request.
- ``pharos.sim.cli``: ``pharos sim-engine``.
"""
