"""Exceptions raised by the nextmini package.

Everything the package raises on purpose derives from `NextminiError`, so a control
script can catch one type and keep running; programming errors (a bad argument
type, an unknown direction) stay ordinary `ValueError`/`TypeError`.
"""

from __future__ import annotations


class NextminiError(Exception):
    """A problem with the emulator's state or the connection to it."""


class NotFoundError(NextminiError, LookupError):
    """A topology, node or link name that the database does not know.

    The message lists the names that do exist, because the usual cause is a typo.
    """


class RefusedWriteError(NextminiError):
    """The database refused a write: it breaks a rule the YAML would also refuse.

    The database checks every write a control script makes (see the README's SQL
    section); its message names the table, the row, the column and the key at
    fault and says what the rule is, e.g. ``links s-y: params_forward.loss_ppm:
    must be at most 1000000, got 2000000``. That message is the text of this
    exception, unchanged, and nothing was written.
    """


class LinkParamsError(RefusedWriteError, ValueError):
    """Link parameters the database's rules refuse; nothing was written.

    ``link`` and ``column`` (``params_forward`` or ``params_backward``) say where,
    ``key`` which parameter (``queue.limit_packets``; empty when the whole object
    is at fault), and the message what is wrong, as the database words it.
    """

    def __init__(self, message: str, *, link: str, column: str) -> None:
        super().__init__(message)
        self.link = link
        self.column = column
        rest = message.split(f"{column}", 1)[1] if column in message else ""
        self.key = rest.split(":", 1)[0].lstrip(".") if rest.startswith(".") else ""


class RouteError(RefusedWriteError):
    """The database refused a route or route rule.

    The schema's triggers validate every route (it must follow links, visit no
    node twice, and run between the rule's src and dst); their message, e.g.
    ``route a-d: no link between a and d (path[0] to path[1])``, is the text of
    this exception, unchanged.
    """
