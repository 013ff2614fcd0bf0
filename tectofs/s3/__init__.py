"""The S3-compatible gateway: buckets are top-level directories, objects are files, so the
same bytes are reachable through S3, the client library, fsspec and the mount.

``tectofs s3 --meta HOST:PORT --listen HOST:PORT --key-file cluster.key`` serves it
(:class:`tectofs.s3.server.S3Gateway`); ``tectofs s3 keys`` prints a user's S3 key pair
(:func:`tectofs.s3.principals.keys_of`). Modules: ``sigv4`` (authentication), ``body``
(request bodies), ``xml`` (documents and errors), ``objects`` (keys as files, atomic
publish), ``listing``, ``multipart``, ``headers`` (stored headers, conditions, part spans), ``handlers``
(the operations), ``server``, ``cli``.
Needs aiohttp (the ``s3`` extra).
"""
