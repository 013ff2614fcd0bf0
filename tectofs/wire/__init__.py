"""The wire: how tectofs processes talk.

``framing`` (frames, sans-I/O decoder), ``messages`` and ``values`` (every request and reply
type, the operation table), ``transport`` (connecting: TCP, TLS, local sockets, reply payloads),
``client`` (``RpcClient``: pooled connections, typed calls), ``server`` (``RpcServer``, handler
tables), ``auth`` (hello authentication, keys, capabilities, file handles), ``tls``,
``local_sockets``, ``connlimits`` (connection admission) and ``sendfile`` (zero-copy replies).

Nothing here imports the roles (client library, servers, store) that use it.
"""
