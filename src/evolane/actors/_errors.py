"""Typed errors raised at the sender side of actor messaging."""

from __future__ import annotations


class ActorError(Exception):
    """Base of every error the actor kernel raises to a caller."""


class MessageTypeError(ActorError, TypeError):
    """The object is not a message type the target actor accepts; nothing was enqueued."""


class MailboxFull(ActorError):
    """`tell_nowait` found the bounded mailbox full; nothing was enqueued."""


class ActorStopped(ActorError):
    """The target actor has stopped for good; the message was refused, nothing was enqueued."""


class NotAnswered(ActorStopped):
    """The asked message was enqueued, but the actor stopped before handling it (a dead letter)."""


class ActorCrashed(ActorError):
    """The target actor raised while handling the asked message; ``__cause__`` is its error."""


class AskTimeout(ActorError, TimeoutError):
    """No answer arrived within the `ask` timeout (the message may still be handled)."""
