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


class RolloutServer:
    """Serves one engine (see the module docstring). ``close()`` stops the thread; a request sent after it,
    or still waiting then, fails with RuntimeError."""

    def __init__(self, engine: RolloutEngine, max_num_seqs: int = 256) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        self.engine = engine
        self.max_num_seqs = max_num_seqs
        self._waiting: list[tuple[TokenRequest, concurrent.futures.Future]] = []
        self._in_flight: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._closed = False
        self.engine_calls = 0
        """engine calls made so far (how many batches the requests formed)"""
        self._threads = torch.get_num_threads()
        self._thread = threading.Thread(target=self._serve, name="rollout-server", daemon=True)
        self._thread.start()

    def submit(self, request: TokenRequest) -> concurrent.futures.Future:
        """Queue one request; its future resolves to the TokenResponse (or the engine's error)."""
        return self.submit_all([request])[0]

    def submit_all(self, requests: list[TokenRequest]) -> list[concurrent.futures.Future]:
        """Queue requests together (the server sees them at once); one future per request."""
        ids = [request.request_id for request in requests]
        futures: list[concurrent.futures.Future] = [concurrent.futures.Future() for _ in requests]
        with self._lock:
            if self._closed:
                raise RuntimeError("the rollout server is closed")
            repeated = {i for i, count in Counter(ids).items() if count > 1} | self._in_flight.intersection(
                ids
            )
            if repeated:
                raise ValueError(f"request ids already in flight or repeated: {sorted(repeated)[:5]}")
            self._in_flight.update(ids)
            self._waiting.extend(zip(requests, futures, strict=True))
            self._wake.notify()
        return futures

    async def generate(self, request: TokenRequest) -> TokenResponse:
        """The coroutine form of `submit`: many may be awaited at once."""
        return await asyncio.wrap_future(self.submit(request))

    def generate_many(self, requests: Iterable[TokenRequest]) -> list[TokenResponse]:
        """Send all requests at once and wait for every answer (in the order given)."""
        return [future.result() for future in self.submit_all(list(requests))]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            waiting, self._waiting = self._waiting, []
            self._wake.notify()
        for request, future in waiting:
            future.set_exception(
                RuntimeError(f"the rollout server closed before request {request.request_id}")
            )
        self._thread.join()

    def _serve(self) -> None:
        # OpenMP's thread count is per OS thread: a new thread starts with the default, not the trainer's
        # torch.set_num_threads (vLLM's CPU attention checks that its plan and its kernel agree on it).
        torch.set_num_threads(self._threads)
        while True:
            with self._lock:
                while not self._waiting and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                batch = self._waiting[: self.max_num_seqs]
                del self._waiting[: self.max_num_seqs]
            self._run(batch)

    def _run(self, batch: list[tuple[TokenRequest, concurrent.futures.Future]]) -> None:
        requests = [request for request, _ in batch]
        try:
            responses = self.engine.generate_tokens(requests)
            self.engine_calls += 1
        except BaseException as error:  # the engine's error goes to every request of the batch
            outcome: list = [error] * len(batch)
        else:
            outcome = list(responses)
        with self._lock:
            for request, _ in batch:
                self._in_flight.discard(request.request_id)
        for (_, future), result in zip(batch, outcome, strict=True):
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)


def generate_batch(
    server: RolloutServer, prompts: DataProto, sampling: SamplingParams, weights_version: int | None = None
) -> DataProto:
    """The batch API as a client of the server: one request per prompt row, all in flight at once."""
    engine = server.engine
    responses = server.generate_many(requests_from_batch(prompts, sampling, weights_version))
    return batch_from_responses(prompts, responses, engine.eos_token_ids, engine.pad_token_id, sampling)
