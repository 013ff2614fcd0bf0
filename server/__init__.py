"""Server roles: the metadata service (:mod:`tectofs.server.meta`) and the chunk server
(:mod:`tectofs.server.chunk`), plus the local cluster launcher (:mod:`tectofs.server.cluster`)."""
