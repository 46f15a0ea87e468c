"""What the engine models share: counters, control requests, the clock that holds, and how a step's
tokens are told. Kept apart from ``pharos.sim.model`` (the types every layer sees) so each model
holds only what makes it differ: how it admits, schedules and caches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import partial

from twisted.internet.interfaces import IReactorTime

from pharos.sim.model import (
    CANCELLED,
    DONE,
    LENGTH,
    STOP,
    EngineStatus,
    GenRequest,
    Job,
    Knobs,
    ModelStatus,
    _Timer,
    _Timers,
    token_text,
)


class ModelCore:
    """The bookkeeping of an ``EngineModel``: subclasses check their own arguments first, then
    call ``__init__``, and build on the helpers below."""

    def __init__(self, clock: IReactorTime, slots: int, knobs: Knobs | None) -> None:
        self.clock = clock
        self.slots = slots
        self.knobs = knobs or Knobs()
        self._timers = _Timers(clock)
        self._controls: dict[int, _Timer] = {}
        self._next_id = 0
        self._prompt_total = 0
        self._computed_total = 0
        self._cached_total = 0
        self._generated_total = 0
        self._prefill_total = 0.0
        self._prefills = 0  # first tokens produced: prefills completed
        self._decode_total = 0.0
        self._tokens_max = 0
        self._finished: dict[str, int] = {}

    def hold(self) -> None:
        """Freeze the model's clock."""
        self._timers.hold()

    def stop(self) -> None:
        """Cancel every pending step."""
        self._timers.cancel_all()
        self._controls.clear()

    @property
    def held(self) -> bool:
        """Whether ``hold`` is in force."""
        return self._timers.held

    def _output(self, request: GenRequest) -> tuple[int, str]:
        """Tokens to generate and the finish reason: a cap the request names ends it with
        "length", the model's own cap stands for the model stopping by itself ("stop")."""
        cap = self.knobs.max_output_tokens
        want = request.max_tokens
        if want is None or want <= 0:
            return cap, STOP
        return min(want, cap), LENGTH if want <= cap else STOP

    def _control(self, job: Job) -> None:
        """A load or unload request: it ends on the next turn."""
        self._controls[job.id] = self._timers.after(0, partial(self._control_done, job))

    def _drop_control(self, job: Job) -> bool:
        """Cancel ``job``'s pending end if it is a control request in flight; whether it was."""
        control = self._controls.pop(job.id, None)
        if control is None:
            return False
        control.cancel()
        return True

    def _control_done(self, job: Job) -> None:
        self._controls.pop(job.id, None)
        job.state = DONE
        job.finished_at = self.clock.seconds()
        job.listener.done(job)

    def _count_admit(self, job: Job) -> None:
        """``job`` is scheduled for the first time: its prompt, cached and computed tokens."""
        self._prompt_total += job.prompt_tokens
        self._cached_total += job.cached_tokens
        self._computed_total += job.prompt_tokens - job.cached_tokens

    def _done(self, job: Job, now: float) -> None:
        """``job`` produced its last token: counted by its finish reason (its text is dropped
        by ``forget``, once the model no longer needs it)."""
        job.state = DONE
        job.finished_at = now
        reason = job.finish_reason or STOP
        self._finished[reason] = self._finished.get(reason, 0) + 1
        self._decode_total += job.decode_seconds
        self._tokens_max = max(self._tokens_max, job.prompt_tokens + job.tokens_done)

    def _cancelled(self, job: Job, now: float) -> None:
        """The client left: ``job`` ends, keeps no text, and counts as an abort unless it was
        a control request."""
        job.state = CANCELLED
        job.finished_at = now
        forget(job)
        if job.request.control is None:
            self._finished["abort"] = self._finished.get("abort", 0) + 1

    def _status(self, models: Sequence[ModelStatus], jobs: Sequence[Job], kv_capacity: int,
                served: Sequence[Job] = (), preemptions: int = 0,
                prefix_queries_total: int | None = None,
                prefix_hits_total: int | None = None,
                kv_block_tokens: int | None = None) -> EngineStatus:
        """An ``EngineStatus`` with this model's counters."""
        return EngineStatus(
            slots=self.slots,
            models=tuple(models),
            jobs=tuple(jobs),
            kv_capacity=kv_capacity,
            kv_block_tokens=kv_block_tokens,
            served=tuple(served),
            prompt_tokens_total=self._prompt_total,
            computed_tokens_total=self._computed_total,
            cached_tokens_total=self._cached_total,
            generated_tokens_total=self._generated_total,
            prefill_seconds_total=self._prefill_total,
            prefills_total=self._prefills,
            decode_seconds_total=self._decode_total,
            tokens_max=self._tokens_max,
            finished=dict(self._finished),
            preemptions=preemptions,
            prefix_queries_total=prefix_queries_total,
            prefix_hits_total=prefix_hits_total,
        )


def forget(job: Job) -> None:
    """A finished or cancelled job keeps no text."""
    job.request = replace(job.request, prompt=b"")


def tell(events: Sequence[tuple[Job, int, bool]]) -> None:
    """Tell each listener of a step's tokens ``(job, index, last)``, in order, and of its end
    after its last token; a job cancelled meanwhile (even by an earlier call) hears nothing."""
    for job, index, last in events:
        if job.state == CANCELLED:
            continue
        job.listener.token(job, index, token_text(index), last)
        if last and job.state != CANCELLED:
            job.listener.done(job)
