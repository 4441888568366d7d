"""Control scripts for Nextmini, the network emulator.

Nextmini keeps desired state and metrics in PostgreSQL; changing a row is how a
control algorithm changes the network. `Controller` reads a topology, changes
routes and link parameters in single transactions, and listens for the
notifications the schema sends.
"""

from .controller import Controller
from .errors import LinkParamsError, NextminiError, NotFoundError, RefusedWriteError, RouteError
from .events import (
    METRICS_CHANNEL,
    NODES_CHANNEL,
    TOPOLOGY_CHANNEL,
    Listener,
    parse_node_event,
)
from .graph import Edge, Hop, hops, path_name, shortest_path, simple_paths, uses_link
from .model import (
    DIRECTIONS,
    Direction,
    Link,
    LinkRate,
    Match,
    Node,
    Route,
    Rule,
    Traffic,
    protocol_number,
)

__version__ = "0.1.0"

__all__ = [
    "Controller",
    "NextminiError",
    "NotFoundError",
    "RefusedWriteError",
    "LinkParamsError",
    "RouteError",
    "Listener",
    "METRICS_CHANNEL",
    "NODES_CHANNEL",
    "TOPOLOGY_CHANNEL",
    "parse_node_event",
    "Edge",
    "Hop",
    "hops",
    "path_name",
    "shortest_path",
    "simple_paths",
    "uses_link",
    "DIRECTIONS",
    "Direction",
    "Link",
    "LinkRate",
    "Match",
    "Node",
    "Route",
    "Rule",
    "Traffic",
    "protocol_number",
]
