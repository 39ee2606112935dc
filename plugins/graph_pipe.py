"""The pipes to the graph process: a writer thread that starts it and sends, a reader
on the scheduler's event loop, and a new process when it dies.

:class:`Pipes` is the part of :class:`~crux_dask.plugins.graph_process.GraphProcess`
that moves messages; what they mean is the rest of that class
(``_on_message``, ``_lost``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from crux_dask.plugins.frames import Frames

try:
    import fcntl
except ImportError:  # not on Windows
    fcntl = None

logger = logging.getLogger(__name__)

__all__ = ["READ_BYTES", "RESTARTS", "GraphProcessGone", "Pipes", "ended"]

#: The most bytes of what the process sends that the event loop reads, and takes
#: messages of, in one turn (a message takes the turn alone if it is larger).
READ_BYTES = 1 << 19
#: How often a graph process that died is started again: one that dies of what it is
#: given dies again.
RESTARTS = 3
#: The messages that ask the process something: ``(kind, number, ...)``, answered by number.
QUESTIONS = frozenset({"drain", "external", "analyse", "piece"})


class GraphProcessGone(RuntimeError):
    """The graph process is gone, or closed: it answers nothing any more."""


class Pipes:
    """Messages to the graph process, posted from the event loop and sent by a writer
    thread (which starts the process first), and messages from it, read on the loop."""

    def _ask(self, *question: Any) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        if not self.alive:
            future.set_exception(GraphProcessGone("Crux's graph process is gone"))
            return future
        number = next(self._requests)
        self._answers[number] = future
        self._asked[number] = message = (question[0], number, *question[1:])
        self._post(message)
        return future

    def _piece(self, generation: int, number: int, index: int) -> asyncio.Future:
        """Piece ``index`` of answer ``number``, which the process of ``generation`` kept."""
        if generation != self._generation:  # it died with that process
            future = asyncio.get_running_loop().create_future()
            future.set_exception(GraphProcessGone("Crux's graph process that kept this "
                                                  "answer is gone"))
            return future
        return self._ask("piece", number, index)

    def _let_go(self, number: int) -> None:
        """Tell the process that the pieces of answer ``number`` are no longer read."""
        if self.alive:
            self._post(("release", number))

    def _fail_answers(self, reason: str) -> None:
        answers, self._answers, self._asked = self._answers, {}, {}
        for future in answers.values():
            if not future.done():
                future.set_exception(GraphProcessGone(reason))

    # -- threads ---------------------------------------------------------------------
    def _post(self, message: tuple) -> None:
        with self._wake:
            self._outgoing.append(message)
            self._wake.notify()
        if not self._started:
            self._started = True
            self._start_writer()

    def _start_writer(self) -> None:
        threading.Thread(target=self._write, args=(self._generation,),
                         name="crux-graph-writer", daemon=True).start()

    def _write(self, generation: int) -> None:
        """Start the process, then send what is posted until ``close``, or until a new
        process takes over (:meth:`_restart`)."""
        try:
            self._spawn()
        except Exception as error:
            logger.error("Crux could not start its graph process: %r", error)
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._lost, f"could not start: {error!r}")
            self._stopping()
            return
        connection = self._outbox
        while True:
            with self._wake:
                while not self._outgoing and self._generation == generation:
                    self._wake.wait()
                if self._generation != generation:
                    return
                message = self._outgoing.popleft()
            started = time.thread_time()
            try:
                data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as error:  # a question that cannot travel: its asker is told
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._unsendable, message, error)
                continue
            try:
                connection.send_bytes(data)
            except (OSError, ValueError):  # the process is gone: reading its pipe says so
                return
            self.seconds["send"] += time.thread_time() - started
            if message[0] == "close":
                return

    def _unsendable(self, message: tuple, error: Exception) -> None:
        """A message that could not be pickled: the question's future fails with why."""
        self.last_error = f"could not send {message[0]!r} to the graph process: {error!r}"
        future = self._answers.pop(message[1], None) if message[0] in QUESTIONS else None
        self._asked.pop(message[1], None)
        if future is not None and not future.done():
            future.set_exception(error)

    def _spawn(self) -> None:
        """Start the process: this module run by the interpreter running the scheduler,
        which imports this package and not the scheduler's main module, over two pipes.

        Its journal goes to the spool directory: a temporary one if none is
        configured, removed with the spool's."""
        if self.settings["spool_dir"] is None:
            self.settings["spool_dir"] = self.spool.directory = tempfile.mkdtemp(
                prefix="crux-spool-")
        process_inbox, outbox = os.pipe()
        inbox, process_outbox = os.pipe()
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "crux_dask.plugins.graph_child", str(process_inbox),
                 str(process_outbox)],
                pass_fds=(process_inbox, process_outbox), stdin=subprocess.DEVNULL)
        finally:
            os.close(process_inbox)
            os.close(process_outbox)
        self._process = process
        self._outbox = Connection(outbox, readable=False)
        inbox = Connection(inbox, writable=False)
        self._outbox.send({**self.settings, "sys_path": sys.path})
        self.remote["pid"] = process.pid
        try:
            self._loop.call_soon_threadsafe(self._listen, inbox)
        except RuntimeError:  # the loop is closed: nobody reads it; "close" is still sent
            inbox.close()

    def _stopping(self) -> None:
        """From the writer, if the process could not start: wake :meth:`close`."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self._loop.call_soon_threadsafe(self._stopped.set)

    # -- when the process dies -----------------------------------------------------
    def _lost(self, why: str) -> None:
        if self.alive and not self._closing and self.restarts < RESTARTS:
            self._restart(why)
            return
        if self.alive:
            self.alive = False
            self.last_error = f"graph process lost: {why}"
            logger.error("Crux's graph process is gone (%s): the graph recorded so far "
                         "is read back from its journal, and later events are counted as "
                         "dropped", why)
        self._fail_answers(f"Crux's graph process is gone ({why})")

    def _restart(self, why: str) -> None:
        """Start a new process, which resumes from the journal; send it again what was
        not durable, and ask again what was not answered (but pieces of answers the
        process kept, gone with it)."""
        self.restarts += 1
        self.last_error = f"graph process restarted: {why}"
        logger.warning("Crux's graph process is gone (%s): a new one resumes from its "
                       "journal (restart %d of %d)", why, self.restarts, RESTARTS)
        if self._process is not None:
            threading.Thread(target=ended, args=(self._process, 5.0),
                             name="crux-graph-reaper", daemon=True).start()
        self._stopped = asyncio.Event()
        self._frames, self._paused, self._heard = Frames(2 * READ_BYTES), False, False
        gone = [number for number, message in self._asked.items() if message[0] == "piece"]
        for number in gone:
            del self._asked[number]
            future = self._answers.pop(number)
            if not future.done():
                future.set_exception(GraphProcessGone(f"Crux's graph process is gone ({why})"))
        with self._wake:
            self._generation += 1
            self._outgoing.clear()
            self._outgoing.extend(message for _, message in self._unacked)
            self._outgoing.extend(self._asked[number] for number in sorted(self._asked))
            self._wake.notify_all()
        self._start_writer()

    # -- on the event loop ---------------------------------------------------------
    def _listen(self, inbox: Connection) -> None:
        """Read what the process sends on the event loop, as it comes.

        A thread that reads it would take the interpreter's lock from the
        loop for every message, and the loop waits up to the lock's switch
        interval (5 ms) to take it back: a graph sent a piece per message held
        the loop 20-60 ms that way.  Read here, in turns of at most
        :data:`READ_BYTES`, a message costs the loop only its unpickling.
        """
        self._inbox = inbox
        descriptor = inbox.fileno()
        os.set_blocking(descriptor, False)
        with contextlib.suppress(AttributeError, OSError):  # Linux: fewer, larger reads
            fcntl.fcntl(descriptor, fcntl.F_SETPIPE_SZ, READ_BYTES)
        self._loop.add_reader(descriptor, self._readable)

    def _readable(self) -> None:
        inbox = self._inbox
        if inbox is None:  # closed since this call was planned
            return
        started = time.thread_time()
        try:  # into buffers kept for it: fresh memory costs a page fault a page
            read, messages = self._frames.read(inbox.fileno(), READ_BYTES)
        except BlockingIOError:
            return
        except OSError:
            read, messages = 0, []
        self._heard = self._heard or bool(messages)
        for message in messages:
            try:
                self._on_message(message)
            except Exception:  # the next messages are still read
                logger.exception("Crux could not take a message of its graph process")
        self.seconds["read"] += time.thread_time() - started
        if self._inbox is None:  # it said it closed
            return
        if read == 0:  # gone without saying it closed
            self._stop_listening()
            self._lost("it exited")
        elif self._frames.waiting:  # the rest in the next turns, the pipe unread meanwhile
            if not self._paused:
                self._loop.remove_reader(inbox.fileno())
                self._paused = True
            self._loop.call_soon(self._readable)
        elif self._paused:
            self._loop.add_reader(inbox.fileno(), self._readable)
            self._paused = False

    def _stop_listening(self) -> None:
        """Stop reading what the process sends, and wake :meth:`close`."""
        inbox, self._inbox = self._inbox, None
        if inbox is not None:
            self._loop.remove_reader(inbox.fileno())
            inbox.close()
        self._stopped.set()



def ended(process: subprocess.Popen, timeout: float) -> None:
    """Wait ``timeout`` seconds for ``process`` to end, then kill it."""
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
