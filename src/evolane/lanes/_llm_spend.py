"""What one backend invocation's model calls spent (`Spend`): the answers' usage summed, and
the least the requests that got no answer may be billed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evolane.lanes._llm import ChatAnswer, Endpoint, chat
from evolane.lanes._llm_usage import add_usage, answer_usage, request_tokens


@dataclass
class Spend:
    """The usage of one backend invocation's model calls, as they come (`ask`): the answers'
    usage summed, and whether a request ended without its answer (cut at its timeout or the
    deadline, cancelled, or failed after sending, a retried one too: a request the provider
    may bill), which makes the `document` ``partial`` and counts each such request's input
    (`request_tokens`), the least it may be billed."""

    model: str
    total: dict[str, Any] | None = None
    unanswered: bool = False
    unanswered_input: int = 0

    async def ask(
        self, endpoint: Endpoint, messages: list[dict[str, str]], **options: Any
    ) -> ChatAnswer:
        """`chat` with ``options``: its answer's usage metered, and the input of each of its
        requests that got no answer (`chat`'s ``unanswered``)."""
        tokens = request_tokens({"messages": messages})

        def unanswered() -> None:
            self.unanswered = True
            self.unanswered_input += tokens

        answer = await chat(endpoint, messages, unanswered=unanswered, **options)
        self.total = add_usage(self.total, answer.usage)
        return answer

    def document(self) -> dict[str, Any]:
        """The usage document of the calls so far: ``partial`` when one was cut off, with
        at least the input of the requests that got no answer."""
        if not self.unanswered:
            return (
                dict(self.total)
                if self.total is not None
                else answer_usage(self.model, cached=False)
            )
        cut = answer_usage(self.model, self.unanswered_input, None, cached=False, partial=True)
        return {**add_usage(self.total, cut), "partial": True, "cached": False}
