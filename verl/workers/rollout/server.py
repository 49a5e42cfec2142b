"""Server mode (``rollout.mode=async``): a rollout replica serving token-in / token-out requests.

Each sample is one request (prompt ids + sampling settings in, response ids + log-probs out); any number
may be in flight at once, from coroutines or threads. One background thread owns the engine: it takes what
is waiting (at most ``max_num_seqs`` requests), generates them in one engine call (vLLM schedules them with
its continuous batching; the batch engines pad them into one batch) and answers each request's future, so
requests that arrive while a batch runs form the next one. The batch API (`generate_batch`) is a client:
it sends one request per prompt row and assembles the answers into the trainer's batch layout.

A request id may be in flight once at a time (a second one with the same id is refused): every response
belongs to exactly one request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import weakref
from collections import Counter
from collections.abc import Iterable

import torch

from verl.protocol import DataProto
from verl.workers.rollout.base import (
    RolloutEngine,
    SamplingParams,
    TokenRequest,
    TokenResponse,
    batch_from_responses,
    requests_from_batch,
)

BATCH_WINDOW_S = 0.005
"""how long the server waits for another request before it starts an engine call with those waiting"""


class _Queue:
    """What the server and its thread share: waiting requests, ids in flight, closed. The thread holds this,
    not the server, so a server nobody references is collected (its engine with it) and its thread ends."""

    def __init__(self) -> None:
        self.waiting: list[tuple[TokenRequest, concurrent.futures.Future]] = []
        self.in_flight: set[str] = set()
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.closed = False

    def close(self) -> None:
        with self.lock:
            self.closed = True
            waiting, self.waiting = self.waiting, []
            self.in_flight.clear()
            self.wake.notify_all()
        for request, future in waiting:
            _settle(future, RuntimeError(f"the rollout server closed before request {request.request_id}"))


def _settle(future: concurrent.futures.Future, outcome: object) -> None:
    """Answer a future unless its client cancelled it (a cancelled request is dropped, never an error here)."""
    if future.done():
        return
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except concurrent.futures.InvalidStateError:  # cancelled between the check and the answer
        pass


class RolloutServer:
    """Serves one engine (see the module docstring). ``close()`` stops the thread; a request sent after it,
    or still waiting then, fails with RuntimeError. A request its client cancels (an asyncio timeout, a
    cancelled task) is dropped: the others are answered as usual."""

    def __init__(self, engine: RolloutEngine, max_num_seqs: int = 256) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        self.engine = engine
        self.max_num_seqs = max_num_seqs
        self.engine_calls = 0
        """engine calls made so far (how many batches the requests formed)"""
        self.requests_answered = 0
        self.engine_seconds = 0.0
        """wall time spent in engine calls so far"""
        self.tokens_generated = 0
        """response tokens of the answered requests so far"""
        self._queue = _Queue()
        weakref.finalize(self, self._queue.close)
        # A new OS thread starts with OpenMP's default thread count and CUDA device 0, not the trainer's:
        # vLLM's CPU attention checks that its plan and its kernel agree on the thread count.
        settings = (
            torch.get_num_threads(),
            torch.cuda.current_device() if torch.cuda.is_initialized() else None,
        )
        self._thread = threading.Thread(
            target=_serve, args=(weakref.ref(self), self._queue, settings), name="rollout-server", daemon=True
        )
        self._thread.start()

    def submit(self, request: TokenRequest) -> concurrent.futures.Future:
        """Queue one request; its future resolves to the TokenResponse (or the engine's error)."""
        return self.submit_all([request])[0]

    def submit_all(self, requests: list[TokenRequest]) -> list[concurrent.futures.Future]:
        """Queue requests together (the server sees them at once); one future per request."""
        ids = [request.request_id for request in requests]
        futures: list[concurrent.futures.Future] = [concurrent.futures.Future() for _ in requests]
        queue = self._queue
        with queue.lock:
            if queue.closed:
                raise RuntimeError("the rollout server is closed")
            repeated = {i for i, count in Counter(ids).items() if count > 1} | queue.in_flight.intersection(
                ids
            )
            if repeated:
                raise ValueError(f"request ids already in flight or repeated: {sorted(repeated)[:5]}")
            queue.in_flight.update(ids)
            queue.waiting.extend(zip(requests, futures, strict=True))
            queue.wake.notify()
        return futures

    async def generate(self, request: TokenRequest) -> TokenResponse:
        """The coroutine form of `submit`: many may be awaited at once."""
        return await asyncio.wrap_future(self.submit(request))

    async def generate_all(self, requests: list[TokenRequest]) -> list[TokenResponse]:
        """The coroutine form of `submit_all`: the answers in the order given."""
        return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in self.submit_all(requests))))

    def generate_many(self, requests: Iterable[TokenRequest]) -> list[TokenResponse]:
        """Send all requests at once and wait for every answer (in the order given)."""
        return [future.result() for future in self.submit_all(list(requests))]

    @property
    def closed(self) -> bool:
        return self._queue.closed

    def close(self) -> None:
        self._queue.close()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def run_batch(self, batch: list[tuple[TokenRequest, concurrent.futures.Future]]) -> None:
        """One engine call for ``batch``; every request gets its response or the call's error."""
        # Requests cancelled while waiting are dropped; the rest can no longer be cancelled.
        batch = [(request, future) for request, future in batch if future.set_running_or_notify_cancel()]
        outcome: list[object] = []
        try:
            if batch:
                start = time.perf_counter()
                responses = self.engine.generate_tokens([request for request, _ in batch])
                self.engine_seconds += time.perf_counter() - start
                if len(responses) != len(batch):
                    raise RuntimeError(
                        f"{type(self.engine).__name__}.generate_tokens answered {len(responses)} of "
                        f"{len(batch)} requests"
                    )
                self.engine_calls += 1
                self.requests_answered += len(batch)
                self.tokens_generated += sum(len(response.response_ids) for response in responses)
                outcome = list(responses)
        except BaseException as error:  # the engine's error goes to every request of the batch
            outcome = [error] * len(batch)
        for (_, future), result in zip(batch, outcome, strict=True):
            _settle(future, result)


def _serve(server_ref: weakref.ref, queue: _Queue, settings: tuple[int, int | None]) -> None:
    threads, cuda_device = settings
    torch.set_num_threads(threads)
    if cuda_device is not None:
        torch.cuda.set_device(cuda_device)
    while True:
        with queue.lock:
            while not queue.waiting and not queue.closed:
                queue.wake.wait()
            limit = _max_batch(server_ref)
            # Requests sent together can arrive one by one (each agent loop reaches its request in turn): wait
            # while more keep coming, so that they form one engine call rather than a call for the first alone.
            while not queue.closed and len(queue.waiting) < limit:
                before = len(queue.waiting)
                queue.wake.wait(BATCH_WINDOW_S)
                if len(queue.waiting) == before:
                    break
            if queue.closed:
                return
            batch = queue.waiting[:limit]
            del queue.waiting[: len(batch)]
        server = server_ref()
        if server is None:  # collected: its finalizer closes the queue
            for request, future in batch:
                _settle(
                    future,
                    RuntimeError(f"the rollout server was dropped before request {request.request_id}"),
                )
            return
        try:
            server.run_batch(batch)
        finally:
            del server
            with queue.lock:
                queue.in_flight.difference_update(request.request_id for request, _ in batch)


def _max_batch(server_ref: weakref.ref) -> int:
    server = server_ref()
    return server.max_num_seqs if server is not None else 1


def generate_batch(
    server: RolloutServer, prompts: DataProto, sampling: SamplingParams, weights_version: int | None = None
) -> DataProto:
    """The batch API as a client of the server: one request per prompt row, all in flight at once."""
    engine = server.engine
    responses = server.generate_many(requests_from_batch(prompts, sampling, weights_version))
    return batch_from_responses(prompts, responses, engine.eos_token_ids, engine.pad_token_id, sampling)
