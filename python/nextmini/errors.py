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


class RouteError(NextminiError):
    """The database refused a route or route rule.

    The schema's triggers validate every route (it must follow links, visit no
    node twice, and run between the rule's src and dst); their message, e.g.
    ``route a-d: no link between a and d (path[0] to path[1])``, is the text of
    this exception, unchanged.
    """
