"""The reports of the tasks a worker finished, and of the files they opened.

A task is reported by the worker, not by the scheduler's hook, because the
worker has every field of it at hand (what distributed's scheduler knows of it
too, and what only the worker knows: when it arrived and when its inputs were
all there, the shards a P2P transfer task made) and spends a few microseconds
on it where the scheduler, which serves every worker, would spend more (see
:mod:`crux_dask.plugins.tasks`); the task's metadata only carries a mark that
says so (:data:`~crux_dask.plugins.protocol.REPORTED`).  Each report is packed
with msgpack as the task finishes and sent with the next batch
(:mod:`crux_dask.plugins.batches`).

A task that opened files (:mod:`crux_dask.plugins.files`) is the exception:
its moments, files and shards travel in its metadata, with its completion, and
the scheduler records it.  The files of a task that opened more than
:data:`FILES_INLINE` are sized in a thread of their own and follow through the
``crux_files`` handler, so that neither the completion nor the event loop
waits for thousands of ``stat``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from crux_dask.plugins.batches import EventBatches
from crux_dask.plugins.files import FileRecorder
from crux_dask.plugins.protocol import FILES, FOLLOW, REPORTED, SHARDS, TIMES, key_string
from crux_dask.plugins.thread_clock import ThreadClocks

if TYPE_CHECKING:
    from distributed import Worker

    from crux_dask.plugins.shuffles import ShardRecorder

__all__ = ["FILES_INLINE", "TaskReports"]

#: The most files whose sizes are taken in the event loop as their task is done
#: (a few microseconds each); a task that opened more has them taken in a thread.
FILES_INLINE = 64


class TaskReports(EventBatches):
    """The tasks a worker's plugin reports, with their files (a mixin of the plugin).

    Attributes
    ----------
    files : FileRecorder or None
        What tasks open, unless files are not captured.
    host : str
        This machine's name, which the files of its tasks are on (set when
        files are captured).
    """

    # Set by the plugin (crux_dask.plugins.worker).
    capture: dict[str, Any]
    file_patterns: tuple[Any, Any]
    shards: ShardRecorder | None

    def _start_cpu(self) -> None:
        """Read the clocks of every thread there is: a task's CPU seconds, and its wait
        for a core, are its thread's since the task before it there (or since now)."""
        self._loop_thread = threading.get_ident()  # coroutine tasks run here: not theirs
        self._clocks = ThreadClocks()
        self._seen: dict[Any, int] = {}  # task -> the thread it was seen running on

    def _cpu(self, key: Any, thread: Any) -> tuple[float | None, float | None]:
        """The CPU seconds, and the wait for a core, of the task ``key`` that ``thread``
        finished now: the thread's since it finished the one before; None where they
        cannot be read.

        The worker may have started its next task on the thread before this one's
        end reached its event loop (when another's did first), or even run it to
        its end: that task's seconds are then in these, and neither task's are
        known.  A task that has ended, its end not heard yet, on a thread not known
        may have been such a task: each end heard notes which thread each task
        running then is on.
        """
        if type(thread) is not int or thread == self._loop_thread:
            return None, None
        running = self.worker.active_threads.get(thread)
        mixed = self._ended_unheard(key, thread) or (running is not None and running != key)
        cpu, waited = self._clocks.since(thread, mixed)
        return (None, None) if mixed else (cpu, waited)

    def _ended_unheard(self, key: Any, thread: int) -> bool:
        """Whether a task other than ``key`` has ended, its end not heard yet, on
        ``thread`` or on a thread not known: not seen running at an end heard before.

        (Whether it started before ``key`` stopped tells nothing: a thread that
        ended its task may take from the pool's queue the one given to another
        that was ending its own.)
        """
        worker, seen = self.worker, self._seen
        if worker.state.nthreads < 2:  # its next task starts once this end is heard
            return False
        with worker.active_threads_lock:  # its threads change it as they start and end
            running = {task: ident for ident, task in worker.active_threads.items()}
        seen.pop(key, None)
        seen.update(running)
        if len(seen) > 4 * worker.state.nthreads:  # tasks that ended other than in memory
            executing = {ts.key for ts in worker.state.executing}
            for task in [task for task in seen if task not in executing]:
                del seen[task]
        for ts in worker.state.executing:
            if ts.key == key or ts.start_time is None or ts.key in running:
                continue  # itself, one about to start, or one running
            where = worker.threads.get(ts.key, seen.get(ts.key))
            if where is None or where == thread:
                return True
        return False

    def _start_files(self, worker: Worker) -> None:
        """Watch the files tasks open, if they are captured; none being sized."""
        self.files: FileRecorder | None = None
        # Files being sized in a thread (task key string by job), and those sized
        # and not sent yet: [key string, files].
        self._sizing: dict[Future, str] = {}
        self._files_out: list[list] = []
        self._sizer: ThreadPoolExecutor | None = None
        if self.capture.get("files", True):
            self.host = socket.gethostname()
            self.files = FileRecorder(worker, *self.file_patterns)
            self.files.start()

    def _report(self, key: Any, moments: list) -> None:
        """Report the task ``key``, which finished now (:data:`REPORT_FIELDS
        <crux_dask.plugins.protocol.REPORT_FIELDS>`); or, if it opened files,
        leave what the scheduler cannot know of it in its metadata."""
        worker = self.worker
        ts = worker.state.tasks.get(key)
        files = self.files
        if ts is None:
            return
        start = stop = None
        for interval in ts.startstops:
            if interval["action"] == "compute":
                start, stop = interval["start"], interval["stop"]
        # distributed converted them with its offset as the task started: a heartbeat
        # since may have moved it; the shift takes them to this plugin's estimate.
        delay = moments[2]
        shift = self.offset - (worker.scheduler_delay if delay is None else delay)
        if stop is None:
            start = stop = self._now()
        else:
            start += shift
            stop += shift
        thread = worker.threads.get(key)
        cpu, cpu_wait = self._cpu(key, thread)
        shards = self.shards
        made = shards.by_task.pop(key) if shards is not None and key in shards.by_task else None
        if files is not None and key in files.by_task:
            opened = self._files_done(key, key_string(key), stop - self.offset)
            if opened is not None:
                # Sent to the scheduler with the task's completion, in the message this
                # transition has just made (it holds the same dict), which also holds
                # the start and stop as distributed converted them: the shift goes too.
                metadata = ts.metadata
                metadata.pop(REPORTED, None)
                metadata[TIMES] = (moments[0], moments[1], shift, cpu, cpu_wait)
                metadata[FILES] = opened
                if made is not None:
                    metadata[SHARDS] = made
                return
        annotations = ts.annotations
        # Packed now, while what it holds is in the processor's cache: packed with the
        # batch, a fraction of a second later, packing took up to half as long again.
        self.reports.append(self._packer.pack([  # keys as they are: the scheduler makes strings
            key, thread, start, stop, ts.nbytes or 0,
            [dts.key for dts in ts.dependencies], ts.prefix,
            annotations.get("crux") if annotations else None, ts.priority,
            moments[0], moments[1], made, cpu, cpu_wait,
        ]))
        self.counts["events_recorded"] += 1
        if len(self.reports) > self.max_buffered_events:
            del self.reports[0]
            self.counts["events_dropped"] += 1
        if len(self.reports) >= self.batch_size and self._sending is None:
            worker.loop.add_callback(self._flush_soon)

    def _files_done(self, key: Any, name: str, stop: float) -> tuple | None:
        """What the task ``key`` (``name``) did with files, if anything; ``stop`` is when
        it stopped, in this worker's clock."""
        taken = self.files.take(key, stop)
        if taken is None:
            return None
        io, opened = taken
        if len(opened) <= 2 * FILES_INLINE:
            files = self.files.keep(self.files.files(opened))
            return (io, self.host, files) if files else None
        if self._sizer is None:
            self._sizer = ThreadPoolExecutor(1, thread_name_prefix="crux-files")
        job = self._sizer.submit(self.files.files, opened)
        self._sizing[job] = name
        job.add_done_callback(self._sized_soon)
        return (io, self.host, FOLLOW)

    def _sized_soon(self, job: Future) -> None:
        """In the sizing thread: hand the sized files to the event loop."""
        with contextlib.suppress(RuntimeError):  # a loop closed meanwhile: nobody to tell
            self.worker.loop.add_callback(self._sized, job)

    def _sized(self, job: Future) -> None:
        """The files of a task sized in the thread go out with the next send."""
        if job.cancelled() or job not in self._sizing:  # by a teardown; or a flush took it
            return
        name = self._sizing.pop(job)
        try:
            files = self.files.keep(job.result())
        except Exception as error:
            self._hook_failed(error)
            files = []
        self._files_out.append([name, files])
        if self._sending is None:
            self._flush_soon()
