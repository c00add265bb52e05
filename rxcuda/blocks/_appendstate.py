"""What the engine last read of an append port's counter: the count, its frame, the peak, and when the
overflow and near-full warnings are due.

A block holds one :class:`AppendState` per append port (``port.append_state``); the engine updates it from
the counts it reads back (``rxcuda.engine._append``), so the state sits here, below both.
"""

from __future__ import annotations

#: percent of the capacity at which a count warns that the port is nearly full (once per episode)
NEAR_FULL_PERCENT = 95
#: percent of the capacity below which an observed count ends an episode (the next one warns again)
EPISODE_END_PERCENT = 90


class AppendState:
    """What the engine last read of an append port's counter.

    ``last_count`` is the raw count (it may exceed ``capacity``: the kernels went on counting after the buffer
    was full), ``frame`` the frame it belongs to, ``peak`` the largest count read so far. ``overflowed`` is
    True while the last count exceeded the capacity. Nothing is read unless someone asks (see
    ``PortHandle.count``), so ``last_count`` is None until then.

    >>> s = AppendState(capacity=100)
    >>> s.update(1, 96, 100), s.update(2, 120, 100), s.update(3, 97, 100), s.overflowed
    (('near_full',), ('overflow',), (), False)
    >>> s.update(4, 10, 100), s.update(5, 130, 100)   # below 90 %: the episode ended, the next one warns
    ((), ('overflow',))
    """

    __slots__ = ("capacity", "last_count", "frame", "peak", "_episode", "_warned_overflow")

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.last_count: int | None = None
        self.frame = -1
        self.peak = 0
        self._episode = False  # the count reached 95 % and has not fallen below 90 % since
        self._warned_overflow = False  # this episode's overflow warning was given

    @property
    def overflowed(self) -> bool:
        """True while the last count read exceeded the capacity."""
        return self.last_count is not None and self.last_count > self.capacity

    @property
    def dropped(self) -> int:
        """Items the last frame read could not keep (raw count minus capacity, at least 0)."""
        return max(0, (self.last_count or 0) - self.capacity)

    def update(self, frame: int, raw: int, capacity: int) -> tuple[str, ...]:
        """Record the raw count of ``frame``; returns the warnings now due, each at most once per episode:
        ``"near_full"`` (a new episode that starts below overflow) and ``"overflow"``. A frame older than the
        last one recorded changes nothing; a new capacity starts afresh."""
        if frame < self.frame:
            return ()
        if capacity != self.capacity:
            self.capacity, self.peak, self._episode, self._warned_overflow = capacity, 0, False, False
        self.frame, self.last_count = frame, raw
        self.peak = max(self.peak, raw)
        due: tuple[str, ...] = ()
        if raw * 100 >= NEAR_FULL_PERCENT * capacity:
            if not self._episode:
                self._episode = True
                if raw <= capacity:
                    due = ("near_full",)
            if raw > capacity and not self._warned_overflow:
                self._warned_overflow = True
                due = ("overflow",)
        elif raw * 100 < EPISODE_END_PERCENT * capacity:
            self._episode = self._warned_overflow = False
        return due

    def describe(self) -> str:
        """One line: the count of the last frame read, its share of the capacity, the peak."""
        if self.last_count is None:
            return "count not read yet"
        pct = 100.0 * self.last_count / self.capacity if self.capacity else 0.0
        text = f"count {self.last_count} of {self.capacity} ({pct:.0f} %) in frame {self.frame}, peak {self.peak}"
        return text + (f", OVERFLOWED ({self.dropped} dropped)" if self.overflowed else "")

    def __repr__(self) -> str:
        return f"<AppendState {self.describe()}>"
