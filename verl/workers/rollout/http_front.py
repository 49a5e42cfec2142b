"""An OpenAI-compatible HTTP front over rollout servers (:class:`~verl.workers.rollout.server.RolloutServer`).

``POST /v1/chat/completions`` and ``POST /v1/completions`` (:mod:`verl.workers.rollout.openai_api` reads the
body and writes the reply), ``GET /v1/models`` and ``GET /health``. Each request becomes ``n`` token requests
handed to one server at once; the server's thread puts whatever is waiting into one engine call, so requests
that arrive together (a reward function awaited for a whole batch of samples) are generated together. With
several servers (replicas) the front routes each request to the one with the fewest requests in flight, the
earlier one on a tie: the router and the servers' HTTP endpoint in one.

aiohttp serves it on an event loop of its own thread; :meth:`OpenAIFront.close` stops the loop, closes the
socket and joins the thread. A request still running then gets its answer or an error, never a hang.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

from verl.workers.rollout.openai_api import (
    ParsedRequest,
    RequestError,
    SamplingDefaults,
    chat_completion,
    chat_prompt_ids,
    completion_prompt_ids,
    error_body,
    parse_sampling,
    reply_text,
    text_completion,
    unknown_fields,
)
from verl.workers.rollout.server import RolloutServer

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 << 20
"""the largest request body accepted (a judge prompt with a long solution in it is far below)"""
SHUTDOWN_S = 10.0
"""how long closing waits for the requests in flight before it cancels them"""


def format_address(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets (what a URL needs)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class FrontStats:
    """What the front answered so far (read from any thread; written by the front's loop only)."""

    def __init__(self) -> None:
        self.requests = 0
        """HTTP requests answered with a reply"""
        self.errors = 0
        """HTTP requests answered with an error"""
        self.prompt_tokens = 0
        self.completion_tokens = 0


class OpenAIFront:
    """Serve ``servers`` (one model's replicas, all with ``tokenizer``) over HTTP on ``host``:``port`` (0: a free
    port). ``stop_ids``: the token ids that end a reply (dropped from its text); ``model_name``: what replies
    and ``/v1/models`` call the model."""

    def __init__(
        self,
        servers: Sequence[RolloutServer],
        tokenizer: Any,
        defaults: SamplingDefaults,
        stop_ids: Sequence[int],
        model_name: str,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        from aiohttp import web

        if not servers:
            raise ValueError("OpenAIFront needs at least one rollout server")
        self.servers = list(servers)
        self.tokenizer = tokenizer
        self.defaults = defaults
        self.stop_ids = list(stop_ids)
        self.model_name = model_name
        self.stats = FrontStats()
        self._in_flight = [0] * len(self.servers)
        self._warned: set[str] = set()
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._sock.bind((host, port))
        except OSError:
            self._sock.close()
            raise
        self.address = format_address(host, self._sock.getsockname()[1])
        """``host:port`` of the front: what a client posts to (``http://{address}/v1/chat/completions``)"""
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(app,), name="openai-front", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            self._thread.join()
            raise self._start_error

    # -- lifecycle --------------------------------------------------------------------------------

    def _run(self, app: Any) -> None:
        from aiohttp import web

        asyncio.set_event_loop(self._loop)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_S)
        try:
            self._loop.run_until_complete(runner.setup())
            self._loop.run_until_complete(web.SockSite(runner, self._sock).start())
        except BaseException as error:  # the caller raises it
            self._start_error = error
            self._sock.close()
            self._loop.close()
            self._started.set()
            return
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(runner.cleanup())
            self._sock.close()
            self._loop.close()

    def close(self) -> None:
        """Stop serving: the socket is closed and the thread joined when this returns."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()

    @property
    def closed(self) -> bool:
        return not self._thread.is_alive()

    # -- routing ----------------------------------------------------------------------------------

    def _pick(self) -> int:
        """The server with the fewest requests in flight (the first of those on a tie)."""
        return min(range(len(self.servers)), key=lambda i: self._in_flight[i])

    async def _generate(self, parsed: ParsedRequest) -> list[Any]:
        index = self._pick()
        self._in_flight[index] += 1
        try:
            futures = self.servers[index].submit_all(parsed.token_requests(_request_id()))
            return list(await asyncio.gather(*(asyncio.wrap_future(future) for future in futures)))
        finally:
            self._in_flight[index] -= 1

    # -- handlers ---------------------------------------------------------------------------------

    async def _answer(
        self, request: Any, prompt_ids: Callable[[Any, dict], list[int]], reply: Callable
    ) -> Any:
        from aiohttp import web

        try:
            body = await request.json()
        except ValueError:
            return self._error("the request body is not JSON", 400)
        if not isinstance(body, dict):
            return self._error("the request body must be a JSON object", 400)
        self._warn_unknown(body)
        try:
            parsed = parse_sampling(body, prompt_ids(self.tokenizer, body), self.defaults)
        except RequestError as error:
            return self._error(str(error), 400)
        try:
            responses = await self._generate(parsed)
        except Exception as error:  # the engine's (every request of its batch gets it), or a closed server
            if any(server.closed for server in self.servers):
                return self._error(f"the server is shutting down: {error}", 503)
            logger.exception("the rollout engine failed on a request")
            return self._error(f"{type(error).__name__}: {error}", 500)
        try:
            replies = [reply_text(self.tokenizer, response, self.stop_ids, parsed) for response in responses]
        except RequestError as error:  # log-probs asked of an engine that returns none
            return self._error(str(error), 400)
        stats = self.stats
        stats.requests += 1
        stats.prompt_tokens += len(parsed.prompt_ids)
        stats.completion_tokens += sum(r.tokens for r in replies)
        return web.json_response(reply(self.model_name, len(parsed.prompt_ids), replies))

    async def _chat(self, request: Any) -> Any:
        return await self._answer(request, chat_prompt_ids, chat_completion)

    async def _completions(self, request: Any) -> Any:
        return await self._answer(request, completion_prompt_ids, text_completion)

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        entry = {"id": self.model_name, "object": "model", "owned_by": "verl"}
        return web.json_response({"object": "list", "data": [entry]})

    async def _health(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(text="ok")

    def _error(self, message: str, status: int) -> Any:
        from aiohttp import web

        self.stats.errors += 1
        return web.json_response(error_body(message, status), status=status)

    def _warn_unknown(self, body: dict) -> None:
        new = [key for key in unknown_fields(body) if key not in self._warned]
        if new:
            self._warned.update(new)
            logger.warning("request fields %s are not read by this server (ignored)", ", ".join(new))


def _request_id() -> str:
    import uuid

    return f"http-{uuid.uuid4().hex[:16]}"
