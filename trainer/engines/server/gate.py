"""SGLang's admission rules for generation vs weight updates (its tokenizer manager's pause flag and update lock).

- A generation first waits while the server is paused, then holds a shared (reader) lock until it finishes.
- A weight update on a running server takes the exclusive (writer) lock: it waits for every generation in
  flight, and generations arriving meanwhile queue behind it (writer preference).
- A weight update on a paused server runs at once: paused requests stay where the pause left them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class GenerationGate:
    """Pause flag plus a writer-preferring readers/writer lock, as SGLang's tokenizer manager has them."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self.paused = False

    @property
    def in_flight(self) -> int:
        """Generations holding the shared lock."""
        return self._readers

    @property
    def updating(self) -> bool:
        """True while a blocking update holds or waits for the exclusive lock."""
        return self._writer or self._writers_waiting > 0

    @asynccontextmanager
    async def generation(self) -> AsyncIterator[None]:
        """Admit one generation: wait out a pause, then share the lock with other generations."""
        async with self._cond:
            await self._cond.wait_for(lambda: not self.paused)
            await self._cond.wait_for(lambda: not self._writer and not self._writers_waiting)
            self._readers += 1
        try:
            yield
        finally:
            async with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def update(self) -> AsyncIterator[bool]:
        """Exclusive while running (yields True); immediate while paused (yields False)."""
        async with self._cond:
            if self.paused:
                exclusive = False
            else:
                exclusive = True
                self._writers_waiting += 1
                try:
                    await self._cond.wait_for(lambda: not self._writer and self._readers == 0)
                finally:
                    self._writers_waiting -= 1
                self._writer = True
        try:
            yield exclusive
        finally:
            if exclusive:
                async with self._cond:
                    self._writer = False
                    self._cond.notify_all()

    async def pause(self) -> None:
        """New generations wait until `resume`."""
        async with self._cond:
            self.paused = True

    async def resume(self) -> None:
        """Admit generations again."""
        async with self._cond:
            self.paused = False
            self._cond.notify_all()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no generation is in flight; False on timeout."""
        async with self._cond:
            try:
                await asyncio.wait_for(self._cond.wait_for(lambda: self._readers == 0), timeout)
            except TimeoutError:
                return False
        return True
