"""The addresses a server gives out: where others reach it (``--advertise``) and its metrics URL.

A server bound to a wildcard (``0.0.0.0``, ``::``) listens everywhere, but that address is
reachable by nobody: it is never registered or handed out. The rule, for every role:

- the *advertised* address is ``--advertise HOST[:PORT]`` (PORT defaults to the bound port),
  else the bound address; bound to a wildcard without ``--advertise`` there is none, and a
  chunk server (whose address the metadata service hands to every client) refuses to start;
- the *metrics URL* is ``http://HOST:PORT/metrics`` with the metrics port actually bound and
  the metrics host if it is a specific one, else the advertised host; with neither, the
  service refuses to start rather than report a URL nobody can scrape.
"""

from __future__ import annotations

from tectofs.errors import InvalidArgument

WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})


def is_wildcard(host: str) -> bool:
    return host.strip() in WILDCARDS


def split(address: str) -> tuple[str, int | None]:
    """``"HOST"``, ``"HOST:PORT"``, ``"[V6]"`` or ``"[V6]:PORT"`` -> ``(host, port or None)``;
    InvalidArgument naming the text otherwise (an empty host, a bad port, a wildcard)."""
    text = address.strip()
    if text.startswith("["):
        host, close, rest = text[1:].partition("]")
        if not close or (rest and not rest.startswith(":")):
            raise InvalidArgument(f"bad address {address!r}: expected HOST[:PORT] ([V6ADDR]:PORT for IPv6)")
        port_text = rest[1:] if rest else None
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:  # a bare host (an IPv6 one without brackets has no port)
        host, port_text = text, None
    if not host or is_wildcard(host):
        raise InvalidArgument(f"bad address {address!r}: give a host others can reach, not a wildcard")
    if port_text is not None and not (port_text.isdigit() and 0 < int(port_text) < 65536):
        raise InvalidArgument(f"bad address {address!r}: the port must be 1-65535")
    return host, int(port_text) if port_text is not None else None


def join(host: str, port: int) -> str:
    """``HOST:PORT``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def advertised(bound: str, advertise: str | None) -> str | None:
    """The address to give out for a server bound at ``bound`` (``HOST:PORT``): ``advertise``
    with its port defaulting to the bound one, else ``bound`` itself, or None when ``bound``
    is a wildcard and nothing was advertised."""
    bound_host, _, bound_port = bound.rpartition(":")
    if advertise:
        host, port = split(advertise)
        return join(host, port if port is not None else int(bound_port))
    return None if is_wildcard(bound_host.strip("[]")) else bound


def metrics_url(metrics_bound: str, advertised_address: str | None) -> str:
    """The URL others scrape for metrics served at ``metrics_bound`` (``HOST:PORT``, as
    ``tectofs.metrics.serve`` returns it). InvalidArgument when it names no reachable host."""
    host, _, port = metrics_bound.rpartition(":")
    host = host.strip("[]")
    if is_wildcard(host):
        if advertised_address is None:
            raise InvalidArgument(
                f"--metrics {metrics_bound} listens on every address and this service has no address to give"
                " out: add --advertise HOST[:PORT] (the address other hosts reach it at)")
        host = split(advertised_address)[0]
    return f"http://{join(host, int(port))}/metrics"
