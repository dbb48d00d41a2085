"""Small actors shared by the kernel and supervisor tests; each logs what happens to it."""

from __future__ import annotations

from typing import Any

import trio

from evolane import Actor
from evolane.messages import Message, Ping, Pong, StressWork


class Recorder(Actor):
    """Logs start/stop, answers Ping, crashes on StressWork(crash=True), sleeps on seq > 0."""

    accepts = (Ping, StressWork)

    def __init__(self, log: list[tuple[str, str]], fail_start: bool = False) -> None:
        self.log = log
        self.fail_start = fail_start

    async def started(self) -> None:
        if self.fail_start:
            raise RuntimeError(f"{self.context.name} cannot start")
        self.log.append(("start", self.context.name))

    async def receive(self, message: Message) -> Any:
        if isinstance(message, StressWork):
            if message.crash:
                raise ValueError(f"boom {message.seq}")
            if message.seq == 0:
                self.stop()
            else:
                await trio.sleep(message.seq / 1000)
            self.log.append(("handled", self.context.name))
            return message.seq
        assert isinstance(message, Ping)
        return Pong(seq=message.seq, responder=self.context.name)

    async def stopped(self) -> None:
        self.log.append(("stop", self.context.name))


class Stubborn(Actor):
    """Shields its handler from cancellation for ``seq`` ms: a child that ignores cancel a while."""

    accepts = (StressWork,)

    def __init__(self, log: list[tuple[str, Any]]) -> None:
        self.log = log

    async def receive(self, message: Message) -> Any:
        assert isinstance(message, StressWork)
        with trio.CancelScope(shield=True):
            await trio.sleep(message.seq / 1000)
        self.log.append(("shield-done", trio.current_time()))
        await trio.sleep(10)
        self.log.append(("not-cancelled", trio.current_time()))
