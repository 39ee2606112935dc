"""The scheduler's clock as a worker estimates it, from the round trips of its sends.

A worker converts the times it records to the scheduler's clock by adding an
offset.  distributed's own (``Worker.scheduler_delay``) is the midpoint of its
latest heartbeat's round trip, which can be wrong by up to half that round trip:
on a loaded machine, a heartbeat's round trip takes a hundred milliseconds and
more, and each heartbeat moves the offset by tens of them.  On one loaded
machine, where every process reads the same clock and the true offset is 0,
the offsets of two workers running Dask's own collections ranged from -51 ms
to +121 ms: a task's input could seem to arrive before it was made.

:class:`ClockOffset` keeps instead, of all the round trips it is given, the one
that bounds the offset tightest now.  A round trip sent at ``sent`` and
answered at ``received`` (this process's clock), with the other's clock reading
``remote`` in between, puts the offset within half the round trip of
``remote - (sent + received) / 2``.  A sample's bound grows with its age by
:data:`DRIFT`, the rate at which two clocks may run apart, so that a newer,
looser sample takes over in time; a sample that its predecessor's bound
excludes takes over at once (a clock was set).
"""

from __future__ import annotations

import math

__all__ = ["DRIFT", "ClockOffset"]

#: How fast two machines' clocks may run apart, in seconds per second: 100 ppm,
#: ten times what quartz clocks drift by without correction.
DRIFT = 1e-4


class ClockOffset:
    """The offset from this process's clock to another's, from round trips.

    Parameters
    ----------
    offset : float
        The offset to use until the first round trip, of unknown precision.

    Attributes
    ----------
    offset : float
        What to add to this process's clock to read the other's.
    bound : float
        How far ``offset`` may be from the truth, as of its sample (infinite
        before the first).
    """

    __slots__ = ("_at", "bound", "offset")

    def __init__(self, offset: float) -> None:
        self.offset = float(offset)
        self.bound = math.inf
        self._at = 0.0

    def sample(self, sent: float, received: float, remote: float) -> bool:
        """Take a round trip into account.

        Parameters
        ----------
        sent, received : float
            When the request left and its answer arrived, in this process's clock.
        remote : float
            The other clock's reading while the request was served.

        Returns
        -------
        bool
            Whether :attr:`offset` changed: the sample bounds it tighter than the
            one it came from does by now, or that one's bound excludes it.
        """
        if not (sent <= received and math.isfinite(remote) and math.isfinite(sent)
                and math.isfinite(received)):
            return False
        bound = (received - sent) / 2
        offset = remote - (sent + received) / 2
        aged = self.bound + DRIFT * (received - self._at)
        if bound >= aged and abs(offset - self.offset) <= bound + aged:
            return False
        self.offset, self.bound, self._at = offset, bound, received
        return True
