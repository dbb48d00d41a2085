"""The actor kernel: actors, refs with tell/ask, bounded mailboxes, dead letters, statistics."""

from typing import TYPE_CHECKING

from evolane._lazy import lazy_exports

if TYPE_CHECKING:
    from evolane.actors._deadletters import DeadLetterOffice
    from evolane.actors._errors import (
        ActorCrashed,
        ActorError,
        ActorStopped,
        AskTimeout,
        MailboxFull,
        MessageTypeError,
        NotAnswered,
    )
    from evolane.actors._kernel import (
        DEFAULT_ASK_TIMEOUT,
        DEFAULT_MAILBOX_SIZE,
        Actor,
        ActorContext,
        ActorRef,
        ActorStats,
        Mailbox,
        ServeControl,
        is_crash,
        serve,
    )

__all__ = [
    "DEFAULT_ASK_TIMEOUT",
    "DEFAULT_MAILBOX_SIZE",
    "Actor",
    "ActorContext",
    "ActorCrashed",
    "ActorError",
    "ActorRef",
    "ActorStats",
    "ActorStopped",
    "AskTimeout",
    "DeadLetterOffice",
    "Mailbox",
    "MailboxFull",
    "MessageTypeError",
    "NotAnswered",
    "ServeControl",
    "is_crash",
    "serve",
]

__getattr__ = lazy_exports(__name__)
