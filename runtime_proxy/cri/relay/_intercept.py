"""Intercepted calls of one relayed connection: buffering the request, running ``before`` and
``after`` (at once until they first wait), sending the rebuilt request within the server's
windows, holding and releasing the response, and answering a call locally.

Called by the parsers (``_client``, ``_server``) when an intercepted stream's frames arrive.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine, Generator

from runtime_proxy.cri.relay import _wire as w
from runtime_proxy.cri.relay._flow import FlowControl
from runtime_proxy.cri.relay._frames import encode_block, padded, response_message
from runtime_proxy.cri.relay._limits import hit
from runtime_proxy.cri.relay._metrics import code_name
from runtime_proxy.cri.relay._state import MAX_DROPPED, OWED_FLUSH, RELAY, log
from runtime_proxy.cri.relay._streams import (
    AFTER,
    COLLECT,
    DONE,
    HOOK,
    INJECT,
    LOCAL,
    SENT,
    Intercepted,
)
from runtime_proxy.cri.transport import HookRejected


class Interception(FlowControl):
    """Intercepted calls (a ``Session`` unit)."""

    def _start_eager(self, coro: Coroutine[object, None, None]) -> asyncio.Task[None] | None:
        """Run ``coro`` at once until it first waits; only then does it get a task.

        A hook that answers without waiting (no plugin for the stage, say) then costs no trip
        through the event loop, and what it sends joins the write in progress. Python 3.12's
        eager tasks do the same; on 3.11 the part before the first wait runs outside any task
        (``asyncio.current_task()`` is None there), in a context of its own."""
        ctx = contextvars.copy_context()
        try:
            first = ctx.run(coro.send, None)
        except StopIteration:
            return None
        except BaseException:
            # ``_run_before``/``_run_after`` catch everything; this is a relay bug.
            log.exception("relay.task_failed")
            self.close(w.INTERNAL_ERROR)
            return None
        task: asyncio.Task[None] = self._loop.create_task(resume_coro(coro, first), context=ctx)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _start_due(self) -> None:
        """Start the hooks that became due during the parse that just ended."""
        if self._due_before:
            due, self._due_before = self._due_before, []
            for st in due:
                self._start_eager(self._run_before(st))
        if self._due_after:
            due, self._due_after = self._due_after, []
            for st in due:
                task = self._start_eager(self._run_after(st))
                if task is not None:
                    self._after_tasks.add(task)
                    task.add_done_callback(self._after_tasks.discard)
                    st.after_task = task

    def _flush_held(self, upto: Intercepted | None) -> list[bytes]:
        """Release kept-back request HEADERS, oldest first, through ``upto`` (None: all)."""
        out: list[bytes] = []
        held = self._held
        while held:
            st = held.pop(0)
            if st.held_headers is not None:
                out.append(st.held_headers)
                st.held_headers = None
            if st is upto:
                break
        return out

    def _client_icpt_data(
        self, st: Intercepted, mv: memoryview, pos: int, length: int, flags: int, down: list[bytes | memoryview]
    ) -> None:
        """Swallow request DATA of an intercepted stream; give the client its window back."""
        end_stream = flags & w.FLAG_END_STREAM
        if st.phase == COLLECT and length:
            # The window of a collecting stream is returned frame by frame (below), so the
            # client may send at most ``cwin`` bytes in one frame.
            if length > st.cwin:
                hit("flow_control")
                st.client_ended = bool(end_stream)
                self._answer_local(st, w.GRPC_INTERNAL, "", reset=w.FLOW_CONTROL_ERROR)
            else:
                a, b = padded(mv, pos, length, flags, False) if flags & w.FLAG_PADDED else (pos + 9, pos + 9 + length)
                size = b - a
                budget = self._budget
                if (
                    len(st.req) + size <= self._stream_cap
                    and self.buffered + size <= self._conn_cap
                    and budget.held + size <= budget.limit
                ):
                    st.req += mv[a:b]
                    self.buffered += size
                    budget.held += size
                else:
                    st.client_ended = bool(end_stream)
                    self._answer_local(st, w.GRPC_RESOURCE_EXHAUSTED, self._over_budget(len(st.req) + size, size))
        if length:
            repay = min(length, self._debt)
            self._debt -= repay
            if length > repay:
                self._owed += length - repay
                if self._owed >= OWED_FLUSH:
                    down.append(self._take_owed())
            if not end_stream and st.phase == COLLECT:
                down.append(w.window_update(st.sid, length))
        if end_stream:
            st.client_ended = True
            if st.phase == COLLECT:
                self._request_complete(st)
            elif st.phase == LOCAL:
                self._icpt.pop(st.sid, None)

    def _request_complete(self, st: Intercepted) -> None:
        st.client_ended = True
        st.phase = HOOK
        self._due_before.append(st)  # started when the parse ends (``_start_due``)

    def _too_many(self, st: Intercepted) -> None:
        hit("intercepted_streams")
        st.client_ended = st.hdr_end_stream
        self._answer_local(st, w.GRPC_RESOURCE_EXHAUSTED, "too many intercepted calls on this connection")

    async def _run_before(self, st: Intercepted) -> None:
        msg, why = w.grpc_message(st.req)
        try:
            if msg is None:
                await self._interceptor.undecodable(st.path, why)
                out = bytes(st.req)
            else:
                call = await self._interceptor.before(st.path, msg)
                st.call = call
                new = call.request
                out = bytes(st.req) if new == msg else w.grpc_frame(new)
        except HookRejected as exc:
            if st.phase == HOOK:
                self._answer_local(st, exc.code, exc.message)
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("relay.hook_failed", method=st.path)
            if st.phase == HOOK:
                self._answer_local(st, w.GRPC_INTERNAL, f"hook failed: {type(exc).__name__}")
            return
        # The request bytes held become ``out``'s (none if the call was given up meanwhile).
        held = len(st.req)
        st.req = bytearray()
        if st.phase != HOOK or self.state != RELAY or st.hdr_end_stream:
            if held:
                self.buffered -= held
                self._budget.held -= held
            if st.hdr_end_stream and st.phase == HOOK and self.state == RELAY:
                # The HEADERS alone carry the whole request.
                st.phase = SENT
                if st.held_headers is not None:
                    self._send_up(b"".join(self._flush_held(st)))
            return
        st.out = out
        st.off = 0
        if len(out) != held:
            self.buffered += len(out) - held
            self._budget.held += len(out) - held
        st.phase = INJECT
        self._inject_q.append(st)
        self._pump()

    def _pump(self) -> None:
        """Send as much of the rebuilt requests as the server's windows allow."""
        if self.state != RELAY or not self._inject_q:
            return
        frames: list[bytes] = []
        keep: list[Intercepted] = []
        for st in self._inject_q:
            if st.phase != INJECT:
                continue
            if st.held_headers is not None:
                frames.extend(self._flush_held(st))
            total = len(st.out)
            while True:
                rest = total - st.off
                chunk = min(rest, st.window, self._up_window, self._up_max_frame)
                if chunk <= 0 and rest > 0:
                    break
                last = chunk == rest
                frames.append(w.frame_header(w.DATA, w.FLAG_END_STREAM if last else 0, st.sid, chunk))
                frames.append(st.out[st.off : st.off + chunk])
                st.off += chunk
                st.window -= chunk
                self._up_window -= chunk
                self._debt += chunk
                if last:
                    st.phase = SENT
                    st.out = b""
                    self.buffered -= total
                    self._budget.held -= total
                    break
            if st.phase == INJECT:
                keep.append(st)
        self._inject_q = keep
        if frames:
            self._send_up(b"".join(frames))

    def _answer_local(self, st: Intercepted, code: int, message: str, *, reset: int | None = None) -> None:
        """Answer an intercepted call without the runtime; reset the upstream stream.

        With ``reset``, the client gets only RST_STREAM(reset) instead of a gRPC status."""
        if st.phase in (LOCAL, DONE):
            return
        st.phase = LOCAL
        self._release(st)
        sid = st.sid
        self._finish(sid, code_name(code))
        self._dropped[sid] = None
        if len(self._dropped) > MAX_DROPPED:
            del self._dropped[next(iter(self._dropped))]
        if self.state != RELAY:
            return
        flags = self.live.pop(sid, None)
        if flags is None:  # the server already finished the stream
            return
        if st.held_headers is not None and st.held_pure:
            # The server never saw the stream, and its header block changes nothing: drop it.
            self._held.remove(st)
            st.held_headers = None
        else:
            if st.held_headers is not None:
                self._send_up(b"".join(self._flush_held(st)))
            self._send_up(w.rst_stream(sid, w.CANCEL))
        if reset is not None:
            out = w.rst_stream(sid, reset)
        else:
            out = self._error_frames(sid, code, message, bool(flags & 1))
            if not st.client_ended:
                out += w.rst_stream(sid, w.NO_ERROR)
        if st.client_ended:
            self._icpt.pop(sid, None)
        self._send_down(out)

    def _cancel_icpt(self, st: Intercepted) -> None:
        st.phase = DONE
        self._release(st)
        st.resp = None
        st.held_down = None
        self._drop_vheld(st)

    def _drop_vheld(self, st: Intercepted) -> None:
        """Server blocks kept back verbatim for ``st`` will never reach the client: the client's
        table may miss what they changed, so every later block is re-encoded."""
        if self._vheld is st:
            self._vheld = None
            self.verbatim = False

    def _release_down(self, st: Intercepted, down: list[bytes | memoryview]) -> None:
        """Send the response frames kept back so far; the rest of the response passes through."""
        if st.held_down:
            down.extend(st.held_down)
            if st.sid in self.live:
                self.live[st.sid] = 1
        st.held_down = None
        if self._vheld is st:
            self._vheld = None

    async def _run_after(self, st: Intercepted) -> None:
        response = response_message(st.resp, st.resp_encoding)
        if response is None:
            log.warning("relay.after_skipped", method=st.path, reason="response not one decodable message")
        elif st.call is None:
            log.warning("relay.after_skipped", method=st.path, reason="request was not decoded")
        else:
            try:
                await st.call.after(response)
            except Exception:
                log.exception("relay.after_failed", method=st.path)
        st.resp = None
        self._icpt.pop(st.sid, None)
        if self.state != RELAY or st.phase != AFTER:
            self.live.pop(st.sid, None)
            self._drop_vheld(st)
            return
        st.phase = DONE
        self.live.pop(st.sid, None)
        if self._vheld is st:
            self._vheld = None
        if self.down is not None:
            out = st.held_down or []
            st.held_down = None
            raw = st.trailers_raw
            if raw is None:
                raw = w.header_frames(st.sid, encode_block(st.trailers), True, self._down_max_frame)
            out.append(raw)
            self._send_down(b"".join(out))
            self._finish(st.sid, "OK")


class _Resumed:
    """Drives a coroutine that ``Interception._start_eager`` already started, from its first wait on:
    what it waits for is passed to the task, and what the task sends or throws is passed back."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[object, None, None], first: object) -> None:
        self._coro = coro
        self._first = first

    def __await__(self) -> Generator[object, None, None]:
        coro, waiting = self._coro, self._first
        self._first = None
        while True:
            try:
                sent = yield waiting
            except BaseException as exc:  # cancellation, or an error the awaited future raised
                try:
                    waiting = coro.throw(exc)
                except StopIteration:
                    return
            else:
                try:
                    waiting = coro.send(sent)
                except StopIteration:
                    return


async def resume_coro(coro: Coroutine[object, None, None], first: object) -> None:
    await _Resumed(coro, first)
