"""``tectofs check``: many real clients on several hosts run random calls on a small shared
tree, under faults; every history is recorded and checked for one order that explains it.

Layout: :mod:`.plan` draws each client's calls (a fresh subtree per history, so histories are
independent), :mod:`.drivers` turns one call into the client kind's own API (a mount through
``os.*`` on its mountpoint, the client library, S3 through boto3 against the gateway, fsspec
through tectofs's fsspec filesystem), :mod:`.worker` is the process that runs a host's clients
(in the host's network namespace when there are namespaces, :mod:`.hosts`), and :mod:`.runner`
starts the cluster and the hosts, runs the histories, injects faults between and during them
and checks each with :func:`tectofs.testing.linearize.check`.
"""
